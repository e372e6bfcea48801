"""Schemathesis hooks for scripts/schemathesis.sh: the one rule of Lacuna's API that JSON Schema cannot
express. A batch's question ids must be distinct (two of one id is a 400), so generated batches that
repeat an id are not valid requests and are dropped before they are sent."""

import schemathesis


@schemathesis.hook
def filter_body(context, body):
    questions = body.get("questions") if isinstance(body, dict) else None
    if not isinstance(questions, list):
        return True
    ids = [q.get("id") for q in questions if isinstance(q, dict) and q.get("id") is not None]
    return len(ids) == len(set(ids))
