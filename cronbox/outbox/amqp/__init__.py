"""The AMQP transport, shared by the event outbox and the job queue: py-amqp through its public calls.

`broker` publishes batches with confirms (the relay's forward targets, the job publisher),
`consumer_link` is a consumer's connection and channel (prefetch, batched acks, republishing with a
confirm), `broker_loop` is the run `amqp consume` and `amqp work` both make on it, and `unreadable`
catches a delivery py-amqp cannot decode. What a message means and which queues a consumer keeps
beside its own (an event consumer's retry and dead queues) belong to the family using it:
`cronbox.outbox.events.queues`, `cronbox.outbox.queue.job_messages`.
"""
