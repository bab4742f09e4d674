"""The Router: admission of messages (the gates in `admission.py`, deduplication in
`dedup_gate.py`, a batch's durable write in `batches.py`, a stream's pipelining in
`send_pipeline.py`), their lifecycle (`lifecycle.py`) over the live copies (`live.py`),
credit control (`credit_control.py`), the answers to failures (`rejections.py`), inboxes
and delivery to live streams (`inbox.py`, `delivery.py`); `router.py` is the face the rest
of the engine calls."""
