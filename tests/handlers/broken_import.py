"""A handlers module that fails on import, as a host's module with a typo does
(CRONBOX_HANDLERS=tests.handlers.broken_import). Its message spans two lines."""
raise RuntimeError("the clinic's settings module\nis missing")
