"""The ``directload`` commands, one module each; a module's ``run(args)`` carries out its command."""

__all__ = []
