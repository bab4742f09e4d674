"""Swarm messages <-> their stored form (core/swarm_mail.py)."""

from __future__ import annotations

from apiary.core.swarm_mail import SwarmMail
from apiary.swarm.wire import SwarmMessage, parse_message


def mail_of(message: SwarmMessage) -> SwarmMail:
    return SwarmMail(
        message_id=message.message_id, swarm_id=message.swarm_id,
        sender_id=message.sender.agent_id, recipient_id=message.recipient,
        message_type=message.type, content=message.content, sent_at=message.timestamp,
        in_reply_to=message.in_reply_to, thread_id=message.thread_id,
        priority=message.priority, expires_at=message.expires_at,
        references=message.references, attachments=message.attachments,
        metadata=dict(message.metadata), wire=message.to_json(),
    )  # fmt: skip


def message_of(mail: SwarmMail) -> SwarmMessage:
    """The message as it travelled (from `wire`); it was accepted when stored, so a loopback
    http:// sender (a development node's) reads back too."""
    return parse_message(mail.wire, insecure=True)
