"""Check a part file of new SQLite training questions (no model is run):
    python runs/s31/qgen/check_part.py runs/s31/qgen/partN.jsonl N [--expert]
N = 1 or 2 (which pages file and which id range). --expert also runs the scripted real expert (search over the
stepwise-real world's index, seconds) and lists the new questions it cannot solve: those give no SFT row, so rewrite them."""
import collections, json, sys
sys.path.insert(0, "/work/main")
from atomcli.demo import real_docs
corpus, questions = real_docs.load("sqlite")
path, n = sys.argv[1], int(sys.argv[2])
HERE = "/work/main/runs/s31/qgen"
allowed = set(open(f"{HERE}/pages{n}.txt").read().split())
test_pages = set(json.load(open(f"{HERE}/test_pages.json")))
lo = 490 + (n - 1) * 60
new = [json.loads(l) for l in open(path) if l.strip()]
problems = real_docs.verify(questions + new, corpus)
page = lambda i: i.split("#")[0]
known = {q["question"].lower() for q in questions}
test = [q for q in questions if q["split"] == "test"]
from atomcli.rewards import metrics
for q in new:
    num = int(q["id"].rsplit("_", 1)[1])
    if not (lo <= num < lo + 60):
        problems.append(f"{q['id']}: id outside sqlite_{lo}..sqlite_{lo + 59}")
    if q.get("split") != "train":
        problems.append(f"{q['id']}: split must be train")
    if q.get("data_source") != f"sqlite_{q.get('hops')}hop":
        problems.append(f"{q['id']}: data_source must be sqlite_{q.get('hops')}hop")
    if set(q) != {"id", "question", "golden_answers", "data_source", "hops", "support", "split"}:
        problems.append(f"{q['id']}: keys must be id, question, golden_answers, data_source, hops, support, split")
    for s in q.get("support", []):
        if page(s) in test_pages:
            problems.append(f"{q['id']}: support {s} is on a test page")
    if q.get("support") and page(q["support"][-1]) not in allowed:
        problems.append(f"{q['id']}: answer passage {q['support'][-1]} is not on one of your pages")
    if q["question"].lower() in known:
        problems.append(f"{q['id']}: duplicate question")
    golds = {metrics.normalize(g) for g in q["golden_answers"]}
    for t in test:
        if golds & {metrics.normalize(g) for g in t["golden_answers"]}:
            print(f"NOTE {q['id']} has a test question's answer ({t['golden_answers']}: {t['question']}); "
                  "fine if the fact differs, a problem if it restates the test fact")
for p in problems:
    print("PROBLEM", p)
print(len(new), "questions,", dict(collections.Counter(q["hops"] for q in new)), len(problems), "problems")
if "--expert" in sys.argv and not problems:
    from atomcli.demo import real_sft
    real_docs.load = lambda name: (corpus, questions + new)
    rows, dropped = real_sft.trajectories("sqlite", spec="local:/work/main/runs/s30/w2/index.sqlite")
    solved = {str(r["id"]).split("/")[0] for r in rows}
    miss = [q["id"] for q in new if q["id"] not in solved]
    print(f"expert: solves {len(new) - len(miss)} of {len(new)} new; unsolved (no SFT row): {miss}")
