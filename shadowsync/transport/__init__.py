"""How bytes move: collectives among trainers and parameter servers over RPC."""
