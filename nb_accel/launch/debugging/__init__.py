"""The kernel's side of a rank's debugger: the post-mortem the last failure offers
(:mod:`.post_mortems`), and the lines typed at a rank's prompt (:mod:`.prompts`)."""
