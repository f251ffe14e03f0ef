"""The teacher's report reads the rows' fields: the diagnosed mistake is data that the check
returns (`CheckResult.mistakes`), never a pattern searched in a message's text."""

from __future__ import annotations

import xenith_edu.exercises as ex
from xenith_edu.gradebook.report import report
from xenith_edu.grader.judging import _verdict
from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward


def _row(learner: str, message: str, mistake: str) -> dict:
    return {"learner": learner, "notebook": "rmsnorm.ipynb", "exercise": "rmsnorm_backward",
            "status": "failed", "message": message, "mistake": mistake}


def test_the_report_counts_the_mistake_field_and_ignores_message_text() -> None:
    rows = [_row("ann", "Likely mistake: forged by the learner. Really.", ""),
            _row("bob", "anything", "the sign of dx is flipped."),
            _row("cy", "anything else", "the sign of dx is flipped.")]
    text = report(rows, {"learners": 3})
    assert "forged by the learner" not in text
    assert "**rmsnorm_backward**, 2 learners: the sign of dx is flipped." in text


def test_a_diagnosed_check_carries_its_mistakes_as_data() -> None:
    def flipped(dy, x, w, eps):
        dx, dw = rmsnorm_backward(dy, rmsnorm_forward(x, w, eps)[1])
        return -dx, dw

    result = ex.check_rmsnorm_backward(flipped)
    assert not result.passed and result.mistakes
    status, message, mistake = _verdict(result)
    assert status == "failed" and mistake and mistake in " ".join(message.split())
    passed = ex.check_rmsnorm_backward(
        lambda dy, x, w, eps: rmsnorm_backward(dy, rmsnorm_forward(x, w, eps)[1]))
    assert passed.passed and passed.mistakes == () and _verdict(passed)[2] == ""
