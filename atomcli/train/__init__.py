"""Training math shared by the stages: token log-probs and the GRPO loss and update."""
