"""The `--tables` kinds' builders: how each kind's tables are made wherever they live (one
process's, the embedding servers', a checkpoint read back for export). One module per kind,
named by its entry in `shadowsync.spec.table_kinds.TABLE_KINDS`; `kind.TableBuilder` is
what each provides."""
