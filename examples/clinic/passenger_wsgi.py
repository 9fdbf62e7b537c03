# Phusion Passenger (cPanel "Setup Python App"): startup file passenger_wsgi.py, entry point `application`.
from clinic import create_app

application = create_app()
