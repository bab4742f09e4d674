-- Schema version 14: the producer's Ed25519 signature over the stored envelope (message
-- signing on; RFC 6.2), delivered with the message so that its recipient can verify it.
-- Empty for messages admitted without signing and for the coordinator's own.
ALTER TABLE messages ADD COLUMN signature BLOB NOT NULL DEFAULT X'';
