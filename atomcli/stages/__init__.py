"""The stages: one module per command (a config dataclass and `run(table, config, context)`), plus
their file helpers. Lower folders (agent, engines, env, rewards, train, demo) never import from here."""
