"""The research environment: tools, page fetching, the reading agent, the cache, search backends."""
