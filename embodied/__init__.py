"""The app layer: the ``embodied`` command line, the demo page and the method table.

It sits above every room (core, sim, perception, worldmodels, driving) and finds the methods through the
registries their ``register.py`` files fill; nothing below imports it.
"""
