"""What NumPy users call by NumPy's names: ``norm``, ``cond``, ``det``, ``slogdet`` (``norms``) and NumPy's
dispatch protocols on ``Matrix`` (``numpy_protocol``), on top of the other rooms."""
