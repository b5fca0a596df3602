"""Notebook front end: the only place that imports IPython and ipywidgets."""
