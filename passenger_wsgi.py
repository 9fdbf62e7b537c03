from app import application  # noqa: F401  (Passenger looks for `application`)
