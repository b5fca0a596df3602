"""A rank's debugger, driven from the notebook: pdb whose prompts and output travel over the
rank's event channel (:mod:`.remote_pdb`), and the frames of a rank's last failure kept for a
post-mortem (:mod:`.post_mortem`)."""
