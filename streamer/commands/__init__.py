"""Sub-commands of `streamer`, discovered by `streamer.cli`."""
