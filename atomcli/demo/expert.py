"""The demo world's scripted expert: SFT trajectories that really use the tools, one hop per turn.

The expert searches through `atomcli.env.tools.ToolBox` with k = `expert_kit.SFT_K` results per query, so
its observations are byte-identical to what a rollout with `--search local:DIR/index.sqlite --k 3` sees;
with another k the SFT observations are shorter than the rollout's. It reads the fact it needs from the
result whose title is the entity it is looking up (regular expressions over the article's sentences),
opens the page with `browse_webpage` when the snippet stops short of the fact, and searches the bare name
when the article is not among the results. It knows the question's chain (the builder's knowledge) but
takes each fact from what the tools returned.

Three ways of writing, one per world style (`atomcli.demo.world.STYLES`):

- classic: the plan names the hop count ("This is a 3-hop question") and the last turn restates the chain;
- stepwise: the plans name no hop count (a small policy cannot count the relations in a question before
  it has seen anything). After each fact the expert rewrites the question with the fact in place ("The
  question is now: In what year was Rourvre Zetox born?") or says that the fact answers it, so the
  decision to search again or to answer is read off the latest form of the question in the context;
- stepwise-real (`quote=True`): stepwise, with each fact observed by quoting the tool output's sentence
  ("Found it: \"Vroumgrou is a city in Skagromia\"."), as the real-text expert (`real_sft`) does, so both
  kinds of row teach one way to read.
"""

from __future__ import annotations

import json
import random
import re

from atomcli.demo import expert_kit
from atomcli.demo.expert_kit import RESULT_RE, SYSTEM_DATE
from atomcli.demo.generate import REL, Question, Relation, World, kind_words, question_descs

OBS = ("The {t} article says {fact}.", "According to its article, {fact}.", "The result for {t} states that {fact}.")
# after a quote (stepwise-real): the fact in the relation's words, since the quoted sentence often names neither the
# relation nor the entity ("He was born in Vedar in 1829"), and the stepwise rewrite reads the hop from it
RESTATE = ("So {fact}.", "That is, {fact}.", "This means {fact}.")
# the quote comes after the hop's goal: a policy that has not read the value yet picks the sentence by what it looks
# for (quoting without it, the policy quoted the snippet's first sentence whatever the question asked)
QUOTE_FOR = ("For {goal}, the page says \"{quote}\".", "On {goal}: \"{quote}\".",
             "About {goal}, it reads \"{quote}\".", "Looking for {goal}, the text states \"{quote}\".")
PLAN_FIRST = ("This is a {h}-hop question. First find {goal}.",
              "Break the question into {h} lookups, starting with {goal}.",
              "The chain has {h} links; the first is {goal}.")
PLAN_ONE = ("Find {goal}.", "Look up {goal} directly.")
PLAN_NEXT = ("Next find {goal}.", "Now look up {goal}.", "The next link is {goal}.")
ACTION_SEARCH = ("Search for {goal}.", "Run a web search on {goal}.")
HYPOTHESIS = ("If {v} is right, its own article should say {goal}.",
              "Assume {v} is the right entity; its article should answer {goal}.")
RISK = ("Other results mention {t} too; I rely only on its own article.",
        "A similar name could mislead me, so I take the fact from the article titled {t}.")
VERIFY = ("The result title matches {t} exactly, so the fact belongs to it.",
          "The article is about {t} itself, not a namesake.")
REFLECT_END = ("All {h} links are resolved: {chain}.", "The chain {chain} answers the question.")
SNIPPET_SHORT = ("The snippet of the {t} article stops before it says {goal}.",
                 "The {t} result is right, but its snippet does not show {goal}.")
NOT_FOUND = ("None of the results is the article on {t}; the query was too broad.",
             "The results do not include an article titled {t}.")
# the stepwise expert (style "stepwise"): no hop count, the question rewritten after each fact
PLAN_START = ("Start with {goal}.", "First find {goal}.", "Look up {goal} first.")
REWRITTEN = ("The question is now: {q}", "What remains to answer: {q}", "With {v} known, the question becomes: {q}")
ANSWERED = ("{v} answers the question.", "That settles it: the answer is {v}.",
            "Nothing is left to look up; the answer is {v}.")



class Expert:
    """Solves demo questions with the real tools, one hop per turn, writing atomic thoughts."""

    def __init__(self, toolbox, world: World, seed: int, *, stepwise: bool = False, quote: bool = False):
        # quote (stepwise-real): each fact is observed as the tool output's own sentence, as the real-text
        # expert does, instead of the fact template "The result for X states that ..." (which the policy filled
        # with its own query on real text and answered with that query); a REFLECTION then restates the quoted
        # fact in the relation's words (with quotes alone the policy lost track of the hops)
        self.tb, self.world, self.seed, self.stepwise, self.quote = toolbox, world, seed, stepwise, quote

    def solve(self, q: Question) -> dict:
        from atomcli.agent import format as af
        rng = random.Random(f"demo-expert:{self.seed}:{q.id}")
        traj_id = f"{q.id}/0"
        msgs = [{"role": "system", "content": af.system_prompt(date=SYSTEM_DATE)},
                {"role": "user", "content": af.user_message(q.question)}]
        calls: list[dict] = []
        anchor = self.world.get(q.anchor)
        words = kind_words(anchor)
        subject, found = anchor.name, [anchor.name]  # found: the chain as read from the tools

        def goal(i: int, s: str) -> str:
            return REL[q.chain[i]].goal.format(s=s, **words)

        def act(units: list[tuple[str, str]], name: str, args: dict) -> str:
            call = {"name": name, "arguments": args}
            think = "".join(f"<{t}>{x}</{t}>" for t, x in units)
            raw = json.dumps(call, ensure_ascii=False)
            msgs.append({"role": "assistant", "content": f"<think>{think}</think><tool_call>{raw}</tool_call>"})
            parsed = af.parse_tool_call(raw)  # exactly what a rollout would parse from this turn
            res = self.tb.run(parsed, traj_id)
            calls.append({"turn": sum(m["role"] == "assistant" for m in msgs), "name": name,
                          "arguments": json.dumps(parsed.arguments, ensure_ascii=False), "ok": bool(res.ok),
                          "error": res.error, "cached": bool(res.cached),
                          "seconds": None})  # wall time would make the file differ run to run
            msgs.append({"role": "tool", "content": af.tool_message(res.observation)})
            return res.observation

        h = len(q.chain)
        if self.stepwise:
            descs = question_descs(q, self.world)
            units = [("PLAN", rng.choice(PLAN_START).format(goal=goal(0, subject)))]
        else:
            units = [("PLAN", rng.choice(PLAN_FIRST if h > 1 else PLAN_ONE).format(h=h, goal=goal(0, subject)))]
        for i, rel_name in enumerate(q.chain):
            rel = REL[rel_name]
            g = goal(i, subject)
            units.append(("ACTION", rng.choice(ACTION_SEARCH).format(goal=g)))
            query = rng.choice(rel.queries).format(s=subject, **words)
            obs = act(units, "web_search", {"query": [query]})
            value, own, where = self._read(rel, subject, obs, snippet=True)
            units = []
            if own is None:  # the subject's article was not in the top results: search the bare name
                units = [("REFLECTION", rng.choice(NOT_FOUND).format(t=subject)),
                         ("PLAN", f"Search for the name {subject} alone."),
                         ("ACTION", f"Search for {subject}.")]
                obs = act(units, "web_search", {"query": [subject]})
                value, own, where = self._read(rel, subject, obs, snippet=True)
                units = []
            if value is None and own is not None:  # the snippet stops short: read the page
                units = [("OBSERVATION", rng.choice(SNIPPET_SHORT).format(t=subject, goal=g)),
                         ("PLAN", "Open the article and read it in full."),
                         ("ACTION", f"Browse {own}.")]
                obs = act(units, "browse_webpage", {"url_list": [own], "query": g})
                value, _, where = self._read(rel, subject, obs, snippet=False)
                units = []
            if value is None:
                units = [("REFLECTION", f"I could not find {g} in what the tools returned.")]
                break
            fact = rel.states.format(s=subject, v=value, **words)
            said = expert_kit.quote(where, value, [subject]) if self.quote else None
            # one rng draw either way: the quote changes no other draw of the trajectory
            units.append(("OBSERVATION", rng.choice(QUOTE_FOR).format(goal=g, quote=said) if said
                          else rng.choice(OBS).format(t=subject, fact=fact)))
            if said:  # the quote, then the fact it gives (an extra draw only in the quoting style)
                units.append(("REFLECTION", rng.choice(RESTATE).format(fact=fact)))
            # with a quote and its restatement the optional checks (and below, the next hop's PLAN) are left out:
            # a turn must fit the rollout's max_new_tokens (192); quote + restatement + checks + the rewritten
            # question overran it in 1 turn of 10, which the policy then copied and cut short
            # (the same rng draws either way)
            checks = []
            if rng.random() < 0.3:
                checks.append(("VERIFICATION", rng.choice(VERIFY).format(t=subject)))
            if rng.random() < 0.25:
                checks.append(("RISK_ANALYSIS", rng.choice(RISK).format(t=subject)))
            if not said:
                units += checks
            subject = value
            found.append(value)
            if self.stepwise:  # the question with this fact in place, or the fact answers it
                if i + 1 < h:
                    rewritten = q.question.replace(descs[i + 1], value, 1)
                    units.append(("REFLECTION", rng.choice(REWRITTEN).format(q=rewritten, v=value)))
                    plan = ("PLAN", rng.choice(PLAN_NEXT).format(goal=goal(i + 1, value)))
                    if not said:  # with a quote, the ACTION alone names the next goal (length)
                        units.append(plan)
                else:
                    units.append(("REFLECTION", rng.choice(ANSWERED).format(v=value)))
                continue
            if i + 1 < h:
                if rng.random() < 0.35:
                    hyp = rng.choice(HYPOTHESIS).format(v=value, goal=goal(i + 1, value))
                    units.append(("HYPOTHESIS_TESTING", hyp))
                units.append(("PLAN", rng.choice(PLAN_NEXT).format(goal=goal(i + 1, value))))
        answer = found[-1] if len(found) == h + 1 else "unknown"
        if answer != "unknown" and h > 1 and not self.stepwise:
            units.append(("REFLECTION", rng.choice(REFLECT_END).format(h=h, chain=" -> ".join(found))))
        think = "".join(f"<{t}>{x}</{t}>" for t, x in units)
        msgs.append({"role": "assistant", "content": f"<think>{think}</think><answer>{answer}</answer>"})
        n_turns = sum(m["role"] == "assistant" for m in msgs)
        self.tb.forget(traj_id)
        return {**q.row(), "traj_id": traj_id, "group_id": q.id, "sample_idx": 0, "policy": "scripted-expert",
                "messages": msgs, "answer": answer, "finish_reason": "answer",
                "format_ok": af.trajectory_format_ok(msgs), "n_turns": n_turns,
                "n_search": sum(c["name"] == "web_search" for c in calls),
                "n_browse": sum(c["name"] == "browse_webpage" for c in calls), "tool_calls": calls}

    @staticmethod
    def _read(rel: Relation, subject: str, obs: str, *,
              snippet: bool) -> tuple[str | None, str | None, str | None]:
        """(value, url of the subject's own article, the text that states the value) from an observation;
        None where absent.

        From search results only the result titled `subject` counts, and a value cut off by the
        snippet's end (`…`) does not; from a browsed page the whole text counts."""
        own = None
        texts = []
        if snippet:
            for m in RESULT_RE.finditer(obs):
                if m["title"] == subject:
                    own = own or m["url"]
                    texts.append(m["snippet"])
        else:
            texts = [obs]
        for text in texts:
            for pat in rel.patterns:
                m = re.search(pat + r"(?=[.,;:)]| [a-z(]|\s*$)", text)  # a value then a clause boundary
                if m:
                    return m["v"], own, text
        return None, own, None
