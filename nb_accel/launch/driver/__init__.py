"""The one driver: a command run on ranks to its outcome, wherever the ranks live."""
