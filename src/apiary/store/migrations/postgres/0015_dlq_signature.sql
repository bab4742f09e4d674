-- Schema version 15: what vouched for a dead letter's envelope (message signing on): the
-- producer's signature, followed by the signed origin envelope when the coordinator had
-- derived the message (core.signatures.with_origin). A requeue carries it on, so that a
-- verifying recipient still accepts the message. Empty without signing.
ALTER TABLE dlq ADD COLUMN signature BYTEA NOT NULL DEFAULT '';
