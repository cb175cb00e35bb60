"""When synchronization runs: in the background (ShadowSync), in the foreground every k steps,
or inside every step (DDP). Each runner takes rules from `shadowsync.rules` and an exchange
from `shadowsync.transport`."""
