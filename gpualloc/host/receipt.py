"""What a release gave back, as the command line prints it: a :class:`Receipt`.

:meth:`gpualloc.host.protocol.Host.release_receipt` answers with one: the embedded ledger
makes it of its typed result (:func:`receipt_of`), the host's broker sends the same words and
views, so ``release`` through a broker decodes no lease (:func:`receipt_from_answer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.errors import GpuallocError
    from gpualloc.host.terms import ReleaseResult


class Receipt:
    """What a release gave back: each lease ``released``, in words (``describe_lease``) and as
    ``--json`` shows it; the caller's leases ``release --mine`` ``kept``, their jobs still
    running, the same two; and the ``problems``, what could not be released, as the errors the
    command says. (A plain class: ``release`` through a broker makes one and nothing heavier.)"""

    __slots__ = ("kept", "problems", "released")

    def __init__(
        self,
        released: list[tuple[str, dict[str, Any]]],
        kept: list[tuple[str, dict[str, Any]]],
        problems: list[GpuallocError],
    ) -> None:
        self.released = released
        self.kept = kept
        self.problems = problems


def receipt_of(result: ReleaseResult) -> Receipt:
    """The receipt of a typed release result."""
    from gpualloc.json_views import lease_json
    from gpualloc.ledger.occupancy import describe_lease

    return Receipt(
        released=[(describe_lease(lease), lease_json(lease)) for lease in result.released],
        kept=[(describe_lease(lease), lease_json(lease)) for lease in result.kept],
        problems=list(result.problems),
    )


def receipt_answer(result: ReleaseResult) -> dict[str, Any]:
    """What the broker sends of a receipt, beside the leases themselves."""
    receipt = receipt_of(result)
    return {
        "described": [words for words, _ in receipt.released],
        "released_json": [view for _, view in receipt.released],
        "kept_described": [words for words, _ in receipt.kept],
        "kept_json": [view for _, view in receipt.kept],
    }


def receipt_from_answer(answer: dict[str, Any]) -> Receipt:
    """The receipt in a broker's answer to ``release``."""
    from gpualloc.wire.protocol import error_from

    return Receipt(
        released=list(zip(answer["described"], answer["released_json"], strict=True)),
        kept=list(zip(answer.get("kept_described", []), answer.get("kept_json", []), strict=True)),
        problems=[error_from({"error": problem}) for problem in answer["problems"]],
    )
