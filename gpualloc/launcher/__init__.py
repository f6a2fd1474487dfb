"""Launching jobs on their GPUs: placement with the ledger, environment, NUMA binding, exec."""
