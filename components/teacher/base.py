"""What teachers share beside their contract (`lightning_rl.core.contracts.Teacher`)."""

from __future__ import annotations

from lightning_rl.core.deprecation import moved

__getattr__ = moved(__name__, "lightning_rl.core.contracts.teacher", ("Teacher", "TeacherScores"))


def tokenizer_mismatch(student, teacher) -> str | None:
    """Why ``teacher`` (a tokenizer) reads the student's token ids as other text; None when it reads them the same."""
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine == theirs:
        return None
    by_id = {i: token for token, i in theirs.items()}
    differ = sorted(i for token, i in mine.items() if by_id.get(i) != token)
    said = f"its vocabulary has {len(theirs)} tokens, the policy's {len(mine)}"
    if not differ:
        return f"{said} (the teacher's has tokens the policy never samples)"
    i = differ[0]
    mine_by_id = {i: token for token, i in mine.items()}
    return (
        f"{said}; {len(differ)} of the policy's token ids mean another token to the teacher (e.g. id {i} is "
        f"{mine_by_id[i]!r} to the policy, {by_id.get(i, 'nothing')!r} to the teacher)"
    )
