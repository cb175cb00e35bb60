"""The option value types: each option written in a small language of its own (a checkpoint
interval, a switch plan, a straggler...) is parsed once, when its configuration section is
made, into one of these typed values; nothing downstream parses the text again.

A value type is a frozen dataclass with `parse(text) -> value` raising a one-line
`UserError` that names the option, and `text`: what the user wrote, which `str(value)` gives
back, so a configuration written to TOML reads back into the same value (`OptionValue`).
This layer imports only the base layer (no torch): the configuration reads it, and so can
every layer above.

    modes      every --sync mode (`MODES`, `mode_of`)
    interval   --checkpoint-every (`CheckpointEvery`), --sync-interval (`SyncInterval`)
    plan       --switch-plan (`SwitchPlan`)
    share      --switch-at (`BspShare`)
    detector   --switch-detector (`DetectorConfig`)
    straggler  --straggler (`Straggler`) and its link delay (`delay.LinkDelay`)
    table_budget  --evict (`Eviction`), --table-memory (`TableMemory`)
"""
