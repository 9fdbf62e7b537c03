"""The publishing side of the end-to-end test: amqp.* events forwarded to TEST_AMQP_EXCHANGE, nothing
consumed in-process (CRONBOX_HANDLERS=tests.handlers.consuming_forward for the tick)."""
from __future__ import annotations

import os

import cronbox

cronbox.forward("amqp.*", exchange=os.environ.get("TEST_AMQP_EXCHANGE", "unset"), name="consume.forward",
               timeout=2, backoff=[0.2])
