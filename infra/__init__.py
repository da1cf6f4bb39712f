"""tfcluster control plane: config, providers, the remote layer. Never imports click."""
