"""Sync-Switch policies (Li, Mangoubi, Xu, Guo, "Sync-Switch: Hybrid Parameter Synchronization
for Distributed Deep Learning", ICDCS 2021, arXiv 2104.08364): which protocol runs when
(`plan` offline, `detector` + `greedy` / `elastic` / `isolate` online, decided in
`schedule`), the state machine the dense servers drive with it (`machine`: phases, quotas,
rewind), with what settings once it does (`configure`), and the offline search for the BSP
share (`search`)."""
