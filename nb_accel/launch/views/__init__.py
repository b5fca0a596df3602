"""What a launch shows while it runs: the view interface, the text view, printed
output and the stall rule."""
