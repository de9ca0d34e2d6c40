"""Text that neither compile's calibration (runtime/texts.py) nor its parity probes (compile/parity.py) contain,
of every kind users embed: int8's figures are checked on it, since a graph verified on its own probes can still
miss on tables, code and repeated words."""

TABLES = (
    "+---------+--------+-------+\n| region  | sales  | delta |\n+---------+--------+-------+\n| north   | 12,400 | +3.1% |\n"
    "| south   |  9,870 | -0.4% |\n| east    | 15,002 | +7.9% |\n+---------+--------+-------+",
    "| model | params | MTEB |\n|:--|--:|--:|\n| small | 33M | 62.1 |\n| base | 110M | 64.3 |\n| large | 335M | 65.9 |",
    "date,open,high,low,close\n2024-03-01,182.1,184.0,181.2,183.5\n2024-03-04,183.6,185.9,183.0,185.1",
)
CODE = (
    "fn main() {\n    let v: Vec<u32> = (1..=10).filter(|n| n % 3 == 0).collect();\n    println!(\"{:?}\", v);\n}",
    "const total = items.reduce((sum, item) => sum + item.price * item.qty, 0);\nconsole.log(`total: ${total}`);",
    "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 3",
)
REPEATED = (
    "error error error error error error error error error error error error error error error error",
    "ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha ha",
    "go team go team go team go team go team go team go team go team",
)
MARKUP_AND_LISTS = (
    "## Installation\n\n1. Download the archive\n2. Unpack it into `/opt/tool`\n3. Run `./install --user`",
    "<table><tr><th>Name</th><th>Age</th></tr><tr><td>Ana</td><td>34</td></tr></table>",
    "Packing list: passport; charger; two shirts; sunscreen; rain jacket; headphones",
)
SCRIPTS = (
    "ירושלים היא עיר עתיקה בעלת היסטוריה ארוכה.",
    "İstanbul, Avrupa ile Asya arasında yer alan büyük bir şehirdir.",
    "Hà Nội là thủ đô của Việt Nam.",
    "长城是中国古代的军事防御工程。",
    "ಬೆಂಗಳೂರು ಕರ್ನಾಟಕದ ರಾಜಧಾನಿ.",
)
QUERIES = ("cheap flights to lisbon in may", "how to undo git commit", "symptoms of burnout", "q3 revenue")

TEXTS = (*TABLES, *CODE, *REPEATED, *MARKUP_AND_LISTS, *SCRIPTS, *QUERIES)
