"""The shared ledger of GPU leases: schema, state directory, liveness, transactions."""
