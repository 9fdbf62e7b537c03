"""A module whose import fails (a dependency missing on the server)."""
import clinic_dependency_not_installed  # noqa: F401
