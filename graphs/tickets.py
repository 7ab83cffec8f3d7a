"""The workload: customer escalation tickets asking for a refund of one invoice.

Each ticket names its ticket id, customer id, invoice id and the amount to refund in free
text; the planner reads them back from the text. Some customers have several tickets (one
per invoice), so "customers affected" and "duplicate refunds" are different numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Ticket", "dollars", "generate_tickets"]

_TEMPLATES = (
    "Ticket {ticket_id} from customer {customer_id}: I was charged twice for invoice "
    "{invoice_id}. Please refund ${amount}.",
    "Ticket {ticket_id} ({customer_id}): the annual plan on invoice {invoice_id} was "
    "cancelled within the trial window. Refund ${amount}, please.",
    "Ticket {ticket_id}: customer {customer_id} disputes ${amount} on invoice {invoice_id} "
    "(service outage credit approved by support).",
)


def dollars(cents: int) -> str:
    """``14000`` → ``"140"``; ``14050`` → ``"140.50"`` (how a person writes an amount)."""
    whole, rest = divmod(cents, 100)
    return f"{whole}" if rest == 0 else f"{whole}.{rest:02d}"


@dataclass(frozen=True, slots=True)
class Ticket:
    index: int
    ticket_id: str
    customer_id: str
    invoice_id: str
    amount_cents: int
    text: str


def generate_tickets(n: int, seed: int) -> list[Ticket]:
    """``n`` deterministic tickets for ``seed``: one invoice each, ~0.8 n customers."""
    if n < 1:
        raise ValueError("n must be >= 1")
    rng = random.Random(f"tickets:{seed}")
    n_customers = max(1, (n * 4) // 5)
    tickets = []
    for i in range(n):
        customer = rng.randrange(n_customers)
        # Mostly whole dollars ("140", which the planner may drift to 140.0), some cents.
        whole = rng.random() < 0.8
        cents = rng.randrange(20, 500) * 100 if whole else rng.randrange(2000, 50000)
        fields = {
            "ticket_id": f"T-{i + 1:05d}",
            "customer_id": f"C-{customer + 1:05d}",
            "invoice_id": f"INV-{seed % 1000:03d}{i + 1:05d}",
            "amount": dollars(cents),
        }
        text = rng.choice(_TEMPLATES).format(**fields)
        tickets.append(
            Ticket(
                index=i,
                ticket_id=fields["ticket_id"],
                customer_id=fields["customer_id"],
                invoice_id=fields["invoice_id"],
                amount_cents=cents,
                text=text,
            )
        )
    return tickets
