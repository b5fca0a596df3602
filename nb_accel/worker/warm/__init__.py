"""A worker's side of warm launches: what each launch takes on from the kernel before it runs
(:mod:`.call`), and the objects kept from one launch to the next (:mod:`.residents`)."""
