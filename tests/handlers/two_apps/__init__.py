"""Handler modules of two Flask apps in one process (tests/web/test_two_apps.py): `front` and `back`
each own what they define or import; `stray` is imported by the test, by neither app. Their event
types are their own (two_apps.*), and every consumer says where it runs: the process-wide registry
holds them for the rest of the test process too, beside front's forward target."""
