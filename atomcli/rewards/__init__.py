"""Rewards: the official outcome metrics and the judges that score atomic thoughts."""
