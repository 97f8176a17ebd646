"""The agent: its turn format and the token bookkeeping of an episode."""
