"""A launch's failures: the records as they arrive, the verdict (root cause and
knock-on failures), and the exception as the user sees it."""
