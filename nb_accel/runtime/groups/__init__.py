"""The default process group as a whole: dropping it and making it anew on every rank, and the
gloo connections it holds."""
