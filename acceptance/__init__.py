"""Active acceptance tests: GPU, network and storage, before a node takes work, on demand and after repairs."""
