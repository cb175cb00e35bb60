"""How a job's processes start, stop and end: signals and the stop request (`stop`), the
attempts of a restarted launch (`attempts`), and the exit statuses and exceptions that say
why a process ended (`exits`). The lowest layer: it imports nothing above `procfs` and
`errors`, so storage, training and the launcher all use it."""
