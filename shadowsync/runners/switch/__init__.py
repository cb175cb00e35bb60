"""Sync-Switch policies (Li, Mangoubi, Xu, Guo, "Sync-Switch: Hybrid Parameter Synchronization
for Distributed Deep Learning", ICDCS 2021, arXiv 2104.08364): which protocol runs when
(`plan`), and with what settings once it does (`configure`)."""
