"""The Flask side of cronbox: the extension a host app attaches (`extension.py`, its per-app state in
`state.py`), signed downloads and sealed uploads (`files.py`, `uploads.py`, `formstream.py`,
`ranges.py`, `disposition.py`), the web tick, `/health` and `/metrics`, the host's login and CSRF as
cronbox meets them (`hostauth.py`, `hostcsrf.py`, `auth.py`, `client.py`, `hosting.py`), and the
operator's console (`ops/`). Only this room imports Flask: a cron tick never loads it."""
