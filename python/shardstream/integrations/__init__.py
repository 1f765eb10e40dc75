"""Thin adapters that put shardstream's loader inside the training loops people already use."""
