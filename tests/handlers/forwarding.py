"""A forward target for the subprocess tests (CRONBOX_HANDLERS=tests.handlers.forwarding).

TEST_AMQP_EXCHANGE  the exchange events of type fwd.* go to (the test declares it)
TEST_FORWARD_MAX_ATTEMPTS  attempts before a delivery is dead (default 1000)
Timeout 1 s (the lease, with CRONBOX_LEASE_MARGIN=0), backoff 0.2 s, so crashed runs recover fast.
"""
from __future__ import annotations

import os

import cronbox

cronbox.forward("fwd.*", exchange=os.environ.get("TEST_AMQP_EXCHANGE", "unset"), name="to-broker", timeout=1,
               backoff=[0.2], max_attempts=int(os.environ.get("TEST_FORWARD_MAX_ATTEMPTS") or 1000))
