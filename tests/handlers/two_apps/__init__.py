"""Handler modules of two Flask apps in one process (tests/web/test_two_apps.py): `front` and `back`
each own what they define or import; `stray` is imported by the test, by neither app."""
