"""Check a part file of new SQLite *test* questions (no model is run):
    python runs/s33/qgen/check_test.py runs/s33/qgen/partN.jsonl N
N = 1 or 2 (which pages file and which id range: part 1 sqlite_600..659, part 2 sqlite_700..759)."""
import collections, json, sys
sys.path.insert(0, "/work/main")
from atomcli.demo import real_docs
from atomcli.rewards import metrics
corpus, questions = real_docs.load("sqlite")
path, n = sys.argv[1], int(sys.argv[2])
HERE = "/work/main/runs/s33/qgen"
allowed = set(open(f"{HERE}/pages{n}.txt").read().split())
train_pages = set(json.load(open(f"{HERE}/train_pages.json")))
lo = 600 + (n - 1) * 100
new = [json.loads(l) for l in open(path) if l.strip()]
problems = real_docs.verify(questions + new, corpus)
page = lambda i: i.split("#")[0]
known = {q["question"].lower() for q in questions}
used = {s for q in questions for s in q["support"]}
for q in new:
    num = int(q["id"].rsplit("_", 1)[1])
    if not (lo <= num < lo + 60):
        problems.append(f"{q['id']}: id outside sqlite_{lo}..sqlite_{lo + 59}")
    if q.get("split") != "test":
        problems.append(f"{q['id']}: split must be test")
    if q.get("data_source") != f"sqlite_{q.get('hops')}hop":
        problems.append(f"{q['id']}: data_source must be sqlite_{q.get('hops')}hop")
    if set(q) != {"id", "question", "golden_answers", "data_source", "hops", "support", "split"}:
        problems.append(f"{q['id']}: keys must be id, question, golden_answers, data_source, hops, support, split")
    for s in q.get("support", []):
        if page(s) in train_pages:
            problems.append(f"{q['id']}: support {s} is on a page a training question uses")
    if q.get("support"):
        if page(q["support"][-1]) not in allowed:
            problems.append(f"{q['id']}: answer passage {q['support'][-1]} is not on one of your pages")
        if q["support"][-1] in used:
            problems.append(f"{q['id']}: answer passage {q['support'][-1]} already holds another question's answer")
    if q["question"].lower() in known:
        problems.append(f"{q['id']}: duplicate question")
    golds = [g for g in q["golden_answers"]]
    if any(len(g.split()) > 5 for g in golds):
        problems.append(f"{q['id']}: golden answers must be short spans (at most 5 words)")
for p in problems:
    print("PROBLEM", p)
print(len(new), "questions,", dict(collections.Counter(q["hops"] for q in new)), len(problems), "problems")
