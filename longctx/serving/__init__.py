"""Serving knowledge: KV-cache layouts, capacity plans, launch recipes, flag advice."""
