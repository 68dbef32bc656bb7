"""Does an agent message decline what the customer asked? Rules over clause structure first, then a learned model.

A list of refusal phrases keeps missing the next way of saying no ("I must decline", "I'm afraid that isn't
possible", "not in a position to") and keeps flagging sentences that only look like one ("I can't find that order",
"once cancelled it cannot be reinstated. Would you like me to proceed?"). So the rules here describe the grammar of
a refusal instead of its words. The text is normalised first (lower case, typographic apostrophes, contractions
spelled out: "can't" -> "can not", "isn't" -> "is not", "I'm" -> "i am", and their typos "cant", "dont", "isnt"),
cut into sentences, and each sentence into
segments at the points where a new clause takes over (";", ":", a dash, "but", "however", ", so"). A segment
refuses when one of these holds (`RULES`, each named):

- agent inability: the agent (I / we, or no subject at the head of a clause: "No, can't cancel that one") with a
  negated ability, permission or position (can not, am unable to, am not
  allowed / authorised / permitted / in a position / supposed to, will not be able to, do not have the authority
  to, have no way to, ...) and then a verb that is a decision (anything but a lookup or a hedge: find, see, locate,
  verify, tell, hear, guarantee, wait, believe, ...: "I can't find it" reports a lookup, not a refusal; "I can't
  access or change it" refuses by its second verb);
- agent unwillingness: I / we will not / am not going to + a verb that is not a promise ("I won't charge you for
  that", "I won't keep you long", "no, I won't need your password" are good news; "I won't be switching Boston to
  Newark" and "No, I will not waive the fee" refuse), nor reassurance ("don't worry, we won't cancel the others");
- a restriction, in a message that apologises or says "no": "Sorry, refunds can only be issued to the original card",
  "I'm afraid I can only help with one order at a time";
- unavailable, in a message that apologises or says "no": "I'm afraid changing your number isn't available through
  me", "No. Payment deferrals aren't offered on overdue bills", "splitting it won't work, I'm afraid";
- declining verbs with the agent as subject: decline, refuse, deny, reject, turn down, say no;
- impersonal impossibility: "not possible / feasible / an option / permitted / allowed / eligible", "impossible",
  "ineligible", "can not / can no longer be <participle>" (not found / seen / verified / charged, which report a
  lookup or reassure), "no changes can be made", "there is no way to", "nothing I can do", "not something I'll
  do", "outside my authority", "beyond what I am authorised to do", "we do not offer", a request "denied" or
  "rejected", "does not qualify", "afraid not", "off the table", "that's a no", "not on the menu", "beyond my reach",
  "not within my permissions", "goes beyond what an exchange covers", "isn't going to work", "won't go through",
  "nothing I can issue", "not offered on this account", "rather than the card you mentioned";
- policy cited against it: "against our policy", "the policy / fare rules do not allow", "policies prohibit",
  "the system won't let me";
- the outcome kept, for a reason given before it or a rule named beside it: "..., so this one stays as booked",
  "Under our rules the reservation therefore remains in economy", "Your plan will stay in place. Switching is
  limited to once per cycle" (not "per your request it stays as booked", "everything else remains unchanged", nor
  beside a change the agent reports making: "I've processed the exchange, so the item stays with you until ...").

A match does not count when:
- its segment sets a condition or hypothesis before it (if, unless, in case, whether, let me know, should you, why;
  not "even if"): "If it is not eligible, I won't be able to refund it" is not yet a refusal;
- it waits on the customer ("until you ...", or until / unless / without / before + confirming, verifying,
  reviewing, giving details): "I can't proceed until you confirm" is a step of the procedure;
- it is a consequence, not a decision: an impersonal impossibility in a clause opening with "once" / "after" / "as
  soon as" (a "note that" before it aside), or followed at once by one ("can't be changed after it ships", "can't
  be added later"; unless the message opens with "no" or apologises), or one
  followed in the message by an offer to go ahead with the very action ("Would you like me to proceed?", "Are you
  sure?", "(yes/no)", not "... instead?") or to do that very action ("Insurance can't be added later. Shall I add it now?"):
  "Once cancelled it cannot be reinstated. Would you like me to proceed?";
- it answers a question: a rule or impossibility in a message that says so ("Great question. Under our policy ...");
- it is the customer's own step: what the agent can't do "from here" / "remotely" on the customer's phone or settings;
- it states the usual rule that the message then sets aside ("Normally ... can't ..., but since ..., I can ...");
- its segment is itself a question ("Can't I help with something else?", "Is it not possible to ...?"). A refusal
  inside a question sentence still counts when it is a clause of its own ("I can't change it - would you like a
  refund instead?", "Since a refund isn't possible, would you like a certificate?").

When no rule matches, the learned model (refusal_model.py) decides, unless some rule's match in the message was set
aside by the exceptions above (or the message says "no problem"): the model sees words, not a clause's structure.
Each new writer's corpus showed the rules missing a quarter of its refusals; the model, trained on the others, found
most of them (docs/evaluation.md: every corpus, how it was written, its blind figure; tests/test_refusal.py). A
heuristic for a monitor: counted, never scored.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tau2_rl_pipeline.benchmark.refusal_model import Model

# -- normalising --------------------------------------------------------------------------------------------------
_SPELLED = ((r"\bcan't\b|\bcannot\b|\bcant\b", "can not"), (r"\bwont\b", "will not"),
            (r"\b(don|isn|aren|doesn|didn|couldn|wouldn|shouldn|wasn|haven|hasn)t\b", r"\1't"), (r"\bwon't\b", "will not"), (r"\bshan't\b", "shall not"),
            (r"\b(\w+)n't\b", r"\1 not"), (r"\bi'm\b", "i am"), (r"\b(we|you|they)'re\b", r"\1 are"),
            (r"\b(\w+)'ll\b", r"\1 will"), (r"\b(\w+)'ve\b", r"\1 have"),
            (r"\b(i|we|you|they|it|that)'d\b", r"\1 would"),
            (r"\b(it|that|there|this|here|what|which|who|he|she)'s\b", r"\1 is"))


def normalise(text: str) -> str:
    """Lower case, straight apostrophes and dashes spaced, contractions spelled out, spaces collapsed."""
    out = text.replace("\u2019", "'").replace("\u2018", "'").lower()
    for pattern, spelled in _SPELLED:
        out = re.sub(pattern, spelled, out)
    return re.sub(r"[ \t]+", " ", out)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")  # not inside "$12.40" or "#W1234.5"
_SEGMENT_BREAK = re.compile(r";|:|\s[-\u2013\u2014]+\s|\u2014|\s--\s|,?\s\b(?:but|however|although|though)\b"
                            r"|,\s(?:so|and so|since|because|given that|seeing that)\b")

# -- the rules ----------------------------------------------------------------------------------------------------
_ADV = r"(?: (?:really|simply|unfortunately|truly|just|also|still|currently|certainly|definitely|personally|actually"\
       r"|therefore|thus|now|sadly|honestly|possibly|afraid|then|even|at this time|at this point|right now),?){0,3}"
_NEG_ABILITY = (r"can not|can no longer|could not possibly|must not|shall not|(?:am|are)(?: therefore| afraid| sorry)?"
                r" (?:not able|unable|not allowed"
                r"|not permitted|not authori[sz]ed|not in a position|not supposed|no longer able|not going to be able)"
                r"|(?:am|are) unable|would (?:not be able|be unable)|will (?:not be able|be unable|not be allowed"
                r"|not be permitted)|(?:do not|does not) have (?:the |any )?(?:ability|authority|authori[sz]ation"
                r"|permission|power|option|means|capability|clearance|tools?|that option)|(?:have|have got|got) no (?:way"
                r"|ability|authority|option|means|power|grounds|basis)")
# verbs after "I can't" that report a lookup or hedge, not a decision on the request
_NOT_A_DECISION = frozenset(
    "find locate see spot tell say hear understand wait believe thank stress emphasize emphasise overstate imagine "
    "recall remember guarantee promise predict know be seem verify confirm identify access retrieve pull reach load "
    "open read display detect match figure determine speak comment only quite fully always".split())
# verbs after "I won't" that promise the customer something good ("we won't charge you", "I won't keep you long"):
# "I won't" + any other verb declines, apology or not
def _stem(verb: str) -> str:
    """"charge" and "charg(ing)" alike."""
    return verb.rstrip("e")


_GOOD_NEWS = frozenset(
    "charge bill need require ask lose expire affect impact cost penalize penalise interrupt disconnect suspend share "
    "disclose sell store keep contact call email text spam happen take be have let leave forget hold".split())
_GOOD_NEWS_STEMS = frozenset(map(_stem, _GOOD_NEWS))
REASSURANCE = re.compile(r"\b(?:do not worry|no worries|rest assured|good news)\b")
NO_PROBLEM = re.compile(r"\b(?:not|never) (?:going to be |be )?(?:an? )?(?:issue|problem)\b|\bno problem\b")
_LOOKUP_PAIRS = {("help", "but"), ("look", "up"), ("look", "for"), ("pull", "up"), ("make", "out")}
_DECIDE_AFTER = rf"(?: to)?{_ADV} (?P<verb>\w+)(?P<next> \w+)?"
AGENT_UNABLE = re.compile(rf"(?:\b(?:i|we){_ADV} |^\W*(?:(?:no|nope|sorry|afraid),? )?)(?:{_NEG_ABILITY}){_DECIDE_AFTER}")
AGENT_UNWILLING = re.compile(rf"\b(?:i|we){_ADV} (?:will not|would not|am not going to|are not going to)"
                             rf"{_DECIDE_AFTER}")
AGENT_RESTRICTED = re.compile(rf"\b(?:i|we){_ADV} (?:can|am|are) only(?: able to)?{_DECIDE_AFTER}"
                              r"|\b(?:can|may) only be (?P<participle>\w+(?:ed|en|wn|ne|de|lt|id|ft|pt|ld|nt|ot|it|ght))\b")
# what is unavailable or will not work, in a message that apologises or says "no": "I'm afraid changing your number
# isn't available through me", "No. Payment deferrals aren't offered on overdue bills"
UNAVAILABLE = re.compile(r"\b(?:is|are) not (?:offered|available|accepted|provided|an option)\b"
                         r"|\b(?:will|would|does) not work\b")
APOLOGY_OR_NO = re.compile(r"\b(?:sorry|afraid|unfortunate\w*|unfortunatly|apologi[sz]e|regret\w*|sadly)\b|^\s*(?:no|nope)\b")
DECLINING_VERB = re.compile(r"\b(?:i|we)\b(?: (?!not\b|never\b)[\w,]+){0,5}? (?:decline|refuse|deny|reject"
                            r"|turn (?:down|(?:it|this|that|your request|the request) down)|say no)\b")
IMPERSONAL = re.compile(
    r"\b(?:not (?:be )?(?:possible|feasible|doable|an option|allowed|permitted|eligible|authori[sz]ed|supported)"
    r"|(?<!not )(?:impossible|ineligible))\b(?: (?:for (?:me|us) )?to (?P<hedge>\w+))?"
    r"|\bcan (?:not|no longer) be (?P<participle>\w+(?:ed|en|wn|ne|de|lt|id|ft|pt|ld|nt|ot|it|ght))\b"
    r"|\b(?:not|never) (?:something|anything) (?:that )?(?:our|the) (?:policy|policies|rules|terms|fare|plan)"
    r" (?:covers|allows|permits|includes|lets (?:me|us))\b|\banswer (?:has to be|is|must be|will have to be|would be) no\b"
    r"|\bthere (?:is|are) no (?:way|option|means|possibility) (?:to|for (?:me|us|you) to|(?:i|we) can)\b"
    r"|\b(?:nothing|not much|not anything)(?: (?:more|else|further))? (?:that )?(?:i|we) (?:can|could|am able to"
    r"|are able to) (?:do|offer|issue|give|provide|arrange|grant|waive|refund|change)\b|\b(?:i|we) can do nothing\b"
    r"|\b(?:not|never) (?:really )?(?:something|anything|one) (?:that )?(?:i|we) (?:can|could|will|would|am able to"
    r"|are able to|do|offer|allow|support|am allowed to|are allowed to|am going to|am authori[sz]ed|are authori[sz]ed"
    r"|am permitted|are permitted|am in a position)\b"
    r"|\bno can do\b|\bno longer (?:possible|available|an option|allowed|permitted)\b"
    r"|\bthere (?:is|are) no (?:\w+ ){1,2}(?:that )?(?:i|we) (?:can|could|am able to) (?:offer|give|issue|provide|apply)\b"
    r"|\b(?:outside|beyond) (?:of )?(?:what (?:i|we) (?:can|could|am|are)\b|(?:my|our) "
    r"(?:authority|scope|remit|abilities|ability|power|policy|policies))\b"
    r"|\bwe (?:do not|no longer|never) (?:offer|allow|permit|provide|issue|accept|support|do|give|grant|honou?r"
    r"|make exceptions)\b"
    r"|\b(?:request|claim|application|appeal|exception)\b(?: [\w-]+){0,10}? (?:is|was|has been|have been|must be"
    r"|will be|would be) (?:denied|declined|rejected|refused|not approved)\b"
    r"|\bno (?:\w+ ){0,2}can be (?P<no_participle>\w+(?:ed|en|wn|ne|de|lt|id|ft|pt|ld|nt|ot|it|ght))\b"
    r"|\b(?:does|do|will) not (?:qualify|meet the (?:criteria|requirements|conditions))\b"
    r"|\b(?:afraid|sorry|unfortunately),? (?:not|no)\b|\bwish (?:i|we) could\b|\bhands are tied\b"
    r"|\boff the table\b|\bout of the question\b|\bthat is a (?:no|hard no|firm no)\b"
    r"|\bnot (?:on the (?:menu|table|cards)|in the cards)\b|\bbeyond (?:my|our) reach\b"
    r"|\bnot within (?:my|our) (?:permissions?|authority|power|remit|scope|abilities)\b"
    r"|\b(?:goes|go|is|are|falls?) (?:beyond|outside) what (?:\w+ ){0,3}(?:covers?|allows?|permits?|includes?)\b"
    r"|\bsomething (?:that )?(?:i|we) (?:have no|do not have (?:a|the|any)) (?:tool|way|option|ability|authority"
    r"|means|power)\b|\bnot something (?:that )?(?:i|we) have (?:the |any )?(?:authority|ability|power|means|tools?"
    r"|option|permission)\b"
    r"|\b(?:is|are) not going to (?:work|happen|be possible)\b|\bnot happening\b|\bwill not go through\b"
    r"|\bcan not go(?: back)? to\b"
    r"|\b(?:is|are) not (?:offered|available|accepted) (?:on|for|with|to) (?:this|your|that) (?:\w+ )?(?:account|plan|order"
    r"|reservation|booking|line|fare|ticket|type|tier|membership|card)\b"
    r"|\b(?:rather than|instead of) (?:\w+ ){0,6}?you(?: have)? (?:mentioned|asked|requested|wanted|suggested|proposed)\b")
_LOOKUP_OR_REASSURANCE = frozenset("found located seen spotted verified confirmed reached guaranteed charged billed "
                                   "affected impacted lost overstated stressed emphasized".split())
POLICY = re.compile(
    r"\bagainst (?:our|the|company|airline|store|this)? ?(?:policy|policies|rules|terms)\b"
    r"|\b(?:policy|policies|rules|terms|regulations|guidelines|conditions|system) (?:do|does|will|would) not (?:allow"
    r"|permit|let|cover|support)\b"
    r"|\b(?:policy|policies|rules|terms|regulations) (?:prohibit|forbid|prevent|preclude|disallow)s?\b"
    r"|\b(?:will|would|does|do) not (?:let (?:me|us)|allow|permit)\b")
# the request's outcome kept as it is, for a reason given before it: "..., so this one stays as booked", "Under our
# rules the reservation therefore remains as it is" (not "I've moved it; everything else remains unchanged")
OUTCOME_KEPT = re.compile(r"\b(?:remains?|stays?|(?:will|must|has to|have to|would have to|needs? to) (?:stay|remain)"
                          r"|(?:i|we) will (?:keep|leave) (?:\w+ ){1,4}?"
                          r"|is staying|are staying) (?:as (?:it is|is|they are|booked|it was|originally booked)"
                          r"|unchanged|in place|the same|put|with you|where (?:it|they) (?:is|are)"
                          r"|part of|(?:in|on) (?:the |your |this |that )?(?:economy|basic|business|first|booking"
                          r"|reservation|order|account|bill|plan|line|card)\w*)\b")
# what else stays, beside the request: "everything else remains unchanged", "your other flights stay as booked"
OTHER_THINGS = re.compile(r"\b(?:everything|anything|all) else\b|\bthe rest\b|\bother\b|\bper your request\b"
                          r"|\bas (?:you )?(?:requested|asked)\b")
RULE_WORDS = re.compile(r"\b(?:polic\w+|rules?|terms|limited|restricted|permitted|allowed|eligible|not|never|no|already"
                        r"|fixed|at most|only once|once per)\b"
                        r"|\bonly (?:\w+ ){1,3}(?:can|may) be\b")
BECAUSE = re.compile(r"\b(?:so|therefore|thus|hence|under|because|since|per(?! your)|which means|means|given)\b")
# the agent reports a change it made: what else "stays" is not a decline
CHANGE_MADE = re.compile(r"\b(?:i|we) have (?:now |just |already |successfully )?(?:processed|updated|added|changed|cancell?ed"
                         r"|booked|moved|modified|made|issued|applied|submitted|placed|completed|exchanged|refunded"
                         r"|upgraded|switched|set up|gone ahead)\b")
LEARNED = "learned model"  # what refusal_rule names when no rule matched and refusal_model.py flagged the message
RULES = {"agent inability": AGENT_UNABLE, "agent unwillingness": AGENT_UNWILLING,
         "restriction, with an apology": AGENT_RESTRICTED, "unavailable, with an apology": UNAVAILABLE,
         "declining verb": DECLINING_VERB,
         "impersonal impossibility": IMPERSONAL, "policy cited": POLICY, "outcome kept": OUTCOME_KEPT}

# -- what a match is not ------------------------------------------------------------------------------------------
HYPOTHETICAL = re.compile(r"(?<!even )\b(?:if|unless|in case|whether|let me know|should you|in the event"
                          r"|suppose|what if)\b|(?<!that is )(?<!this is )(?<!which is )(?<!explain )\bwhy\b")
WAITS_ON_CUSTOMER = re.compile(r"\buntil you\b|\b(?:until|unless|without|before)\b(?: \S+){0,6}? (?:confirm\w*|verif\w*"
                               r"|authenticat\w*|review\w*"
                               r"|consent|approv\w*|permission|go-ahead|go ahead|identity|provid\w*|details|user id"
                               r"|say so|tell me|give me|share)")
CONSEQUENCE_OPENER = re.compile(r"^\W*(?:(?:just so you know|(?:please )?(?:note|keep in mind|remember|be aware)"
                                r"(?: that)?),? )?(?:once|after|as soon as)\b")
OFFER_TO_PROCEED = re.compile(r"\b(?:would you like (?:me )?to (?:proceed|go ahead|continue|confirm)|do you (?:still )?"
                              r"(?:want|wish) (?:me )?to (?:proceed|go ahead|continue)"
                              r"|shall i (?:proceed|go ahead|continue)"
                              r"|should i (?:proceed|go ahead|continue)|are you sure|please confirm|can you confirm"
                              r"|could you confirm|ready to proceed|reply (?:\W+)?yes|type (?:\W+)?yes)\b|\(yes/no\)")
# "can't be changed after it ships", "can't be added later": a rule ahead (unless the message opens with "no" or an
# apology: "No. Insurance can't be added after booking")
CONDITION_AFTER = re.compile(r"\W*(?:once|after|as soon as|later|afterwards|in the future)\b")
# the customer only asked: a rule explained is an answer ("Great question. Under our policy, basic economy tickets
# cannot be modified, ...")
QUESTION_ANSWERED = re.compile(r"^\W*(?:great|good|fair) question\b|\bto answer your question\b"
                               r"|\byou asked (?:whether|if|about)\b")
# what the agent can't do remotely on the customer's own phone is the customer's step, not a decline
REMOTE = re.compile(r"\b(?:from here|from my end|on my end|from my side|remotely)\b")
OWN_DEVICE = re.compile(r"\byour (?:phone|device|handset|app)\b|\bsettings\b")
INSTEAD = re.compile(r"\b(?:instead|alternative|other option|rather)\b")
USUAL_RULE = re.compile(r"\b(?:normally|usually|typically|generally|ordinarily|in general|as a rule|in most cases)\b")
EXCEPTION_MADE = re.compile(r"\b(?:but|however)\b.*\b(?:i|we) (?:can|will|am able to|are able to|have|could)"
                            r"(?! not)\b")
QUESTION_OPENER = re.compile(r"^\W*(?:can|could|would|will|is|are|am|do|does|did|shall|should|may|might|why|how|what"
                             r"|when|where|which|who|have|has|was|were)\b")


def _counts(rule: str, match: re.Match, segment: str, lead: str, message_after: str, plain: str) -> bool:
    """Whether one rule's match, in its segment (after `lead` in its sentence), is a refusal (module docstring: what
    a match is not)."""
    verb = match.groupdict().get("verb")
    before, after = segment[:match.start()], segment[match.end("verb") if verb else match.end():]
    if HYPOTHETICAL.search(before) or WAITS_ON_CUSTOMER.search(after[:80]):
        return False
    if verb is not None:
        nxt = (match.group("next") or "").strip()
        if verb == "be" and nxt.endswith("ing"):  # "I won't be refunding it": the verb is the next one
            verb, nxt = nxt[:-3], ""  # its stem: "refund", "charg"
        if verb in _NOT_A_DECISION and nxt in ("or", "and"):  # "I can't access or change it": the second verb
            verb, nxt = (re.match(r"\W*(\w*)", after[len(match.group("next") or ""):]).group(1), "")
        if verb in _NOT_A_DECISION or verb == "not" or (
                (verb, nxt) in _LOOKUP_PAIRS and rule != "agent unwillingness"):
            return False
        if rule == "agent unwillingness" and (_stem(verb) in _GOOD_NEWS_STEMS or (
                REASSURANCE.search(plain) and not APOLOGY_OR_NO.search(plain))):
            return False  # "we won't charge you for it", "no, I won't need your password": a promise, not a decline
    if rule == "outcome kept":
        rule_named = RULE_WORDS.search(plain.replace(lead + segment, " "))
        if OTHER_THINGS.search(lead + " " + before) or (CHANGE_MADE.search(plain) and not rule_named) or not (
                rule_named or BECAUSE.search(lead + " " + before)):
            return False
    groups = match.groupdict()
    if (groups.get("participle") or groups.get("no_participle")) in _LOOKUP_OR_REASSURANCE \
            or groups.get("hedge") in _NOT_A_DECISION:
        return False  # "cannot be found", "impossible to predict": a lookup or a hedge
    if rule == "agent inability" and REMOTE.search(after) and OWN_DEVICE.search(plain):
        return False
    if rule in ("impersonal impossibility", "policy cited", "outcome kept") and QUESTION_ANSWERED.search(plain):
        return False
    if rule in ("impersonal impossibility", "outcome kept") and (
            CONSEQUENCE_OPENER.search(before) or (CONDITION_AFTER.match(after) and not APOLOGY_OR_NO.search(plain))
            or any(OFFER_TO_PROCEED.search(s) and not INSTEAD.search(s) for s in _SENTENCE_END.split(message_after))
            or _offers_the_same(groups.get("participle"), message_after)):
        return False
    return True


def _offers_the_same(participle: str | None, message_after: str) -> bool:
    """"Insurance can't be added later ... Shall I add it now?": the message goes on to offer the very action, so the
    impossibility is a warning before doing it, not a decline."""
    if not participle:
        return False
    offered = re.findall(r"\b(?:shall i|should i|(?:would you like|do you want|want) me to|can i|may i)"
                         r"(?: go ahead and)? (\w+)", message_after)
    return any(len(os.path.commonprefix([verb, participle])) >= min(len(verb), 4) for verb in offered)


def refusal_rule(text: str, model: Model | None = None) -> str | None:
    """The name of the first rule (RULES) by which some clause of `text` refuses; else LEARNED when the learned model
    (refusal_model.py) says the message does and no rule's match in it was set aside (a condition, a lookup, a
    consequence: the clause structure the model cannot see); else None. `model`: another than the shipped one (the
    training script's held-out folds)."""
    from tau2_rl_pipeline.benchmark.refusal_model import learned_refusal  # it reads `normalise` from here

    plain = normalise(text)
    rule, set_aside = rule_verdict(plain)
    vetoed = set_aside or NO_PROBLEM.search(plain)  # "That isn't going to be a problem; I've added it"
    return rule or (LEARNED if not vetoed and learned_refusal(text, model) else None)


def rule_verdict(plain: str) -> tuple[str | None, bool]:
    """Of a normalised message: (the first rule by which some clause refuses, or None; whether some rule matched a
    clause and was set aside)."""
    sentences = [s for s in _SENTENCE_END.split(plain) if s.strip()]
    set_aside = False
    for i, sentence in enumerate(sentences):
        later = " ".join(sentences[i + 1:])
        question = sentence.rstrip().endswith("?")
        cuts = [0, *(m.end() for m in _SEGMENT_BREAK.finditer(sentence)), len(sentence)]
        usual = USUAL_RULE.search(sentence) and EXCEPTION_MADE.search(sentence + " " + later)
        for start, end in zip(cuts, cuts[1:]):
            segment = sentence[start:end]
            if question and QUESTION_OPENER.search(segment):
                continue
            message_after = sentence[end:] + " " + later
            for name, rule in RULES.items():
                if rule in (AGENT_RESTRICTED, UNAVAILABLE) and not APOLOGY_OR_NO.search(plain):
                    continue
                for match in rule.finditer(segment):
                    if not usual and _counts(name, match, segment, sentence[:start], message_after, plain):
                        return name, set_aside
                    set_aside = True
    return None, set_aside


def is_refusal(text: str) -> bool:
    """Some clause of `text` declines a request by a rule, or the learned model says the message does."""
    return refusal_rule(text) is not None
