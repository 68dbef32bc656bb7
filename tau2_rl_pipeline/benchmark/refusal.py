"""Does an agent message decline what the customer asked? Clause-level patterns, pure, no model.

A phrase list ("can't ... make") flags "Let me know if you can't make it" and "I can't find that order"; these
patterns ask for the agent declining a request instead:
- the agent (I / we) saying it cannot, is unable, not allowed or not authorised to do a customer-service action
  (help, cancel, refund, modify, ...: not find, see or tell, which report a lookup, not a decision), or that it
  must decline, or does not offer / allow something;
- an action declared impossible in the passive ("cannot be modified", "can no longer be cancelled");
- a policy cited against the request ("against our policy", "policy doesn't allow", "is not permitted",
  "not eligible").
A sentence that is a question is no refusal, and a match is ignored when the sentence before it sets a condition
or a hypothesis ("if", "unless", "without", "in case", "why", "whether", "let me know"): "If it is not eligible
I won't be able to refund it" is not yet a refusal. Measured on a labelled corpus (tests/data/refusals.jsonl; its
precision and recall are in docs/evaluation.md). A heuristic for a monitor: counted, never scored.
"""

from __future__ import annotations

import re

_ACTIONS = (r"help|assist|process|proceed|fulfil+|complete|make|change|modify|cancel|book|provide|issue|offer"
            r"|grant|approve|do|honou?r|waive|override|refund|reimburse|compensate|upgrade|downgrade|exchange"
            r"|return|add|remove|update|accommodate|transfer|send|share|give|apply|lift|unlock|resume|enable"
            r"|reactivate|extend|refuel|switch|look|accept|allow|authori[sz]e|reverse|reinstate")
_PASSIVE = (r"modified|changed|cancell?ed|refunded|returned|exchanged|upgraded|downgraded|booked|enabled|processed"
            r"|waived|removed|added|transferred|issued|resumed|reactivated|unlocked|lifted|applied|reversed|made"
            r"|granted|honou?red|extended|refuelled|refueled|reinstated|combined|split")
_UNABLE = (r"can ?not|can't|can no longer|could ?not|couldn't|(?:'m|am|'re|are) (?:not able|unable)"
           r"|(?:won't|will not) be able|(?:'m|am|'re|are) not (?:allowed|permitted|authori[sz]ed)"
           r"|(?:don't|do not) have (?:the )?(?:ability|authority|permission|means)")
DECLINE = re.compile(
    rf"\b(?:I|we)(?: (?:really|simply|unfortunately|truly|just|also))? ?(?:{_UNABLE})(?: to)?(?: \w+ly)?"
    rf" (?:{_ACTIONS})\b"
    r"|\b(?:I|we) (?:(?:have|must|need) to|(?:'m|am) going to have to|(?:'ll|will) have to) decline\b"
    r"|\bwe (?:don't|do not) (?:offer|allow|permit|provide|issue|accept)\b"
    r"|(?:\bnot|n't) something (?:I|we) (?:can|(?:'m|am|'re|are) able to)\b|\boutside (?:of )?what (?:I|we) can\b"
    rf"|\b(?:{_UNABLE}) be (?:{_PASSIVE})\b"
    r"|\bagainst (?:our|the|company|airline)? ?polic|\bpolic(?:y|ies) (?:doesn't|does not|don't|do not)"
    r" (?:allow|permit)|\b(?:not|isn't|aren't) (?:allowed|permitted|eligible)\b",
    re.IGNORECASE)
HYPOTHETICAL = re.compile(r"\b(?:if|unless|without|in case|whether|why|let me know)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")  # not inside "$12.40" or "#W1234.5"


def is_refusal(text: str) -> bool:
    """Some sentence of `text`, not a question, declines a request with no condition set before the decline."""
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    for sentence in _SENTENCE_END.split(text):
        if sentence.rstrip().endswith("?"):
            continue
        if any(not HYPOTHETICAL.search(sentence[:m.start()]) for m in DECLINE.finditer(sentence)):
            return True
    return False
