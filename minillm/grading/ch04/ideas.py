"""The chapter's ideas and misconceptions, as the concept matcher reads them (see :mod:`concepts`).

Each idea carries how feedback *names* it in both languages, and a hint that points at it
without stating it: the feedback must teach, not hand out the model answer.
"""

from __future__ import annotations

from ..concepts import idea, misconception

_COMPUTE = [r"re-?\s?comput\w*", r"re-?calculat\w*", r"\bcomput\w*", r"\bcalculat\w*", r"\bwork\b", r"\bflops\b",
            r"\bmath\b", r"计算", r"重算", r"运算", r"(?<![打清])算"]
_AVOID = [r"\bavoid\w*", r"\bskip\w*", r"\bsav(e|es|ed|ing)\b", r"\bspar\w*", r"\beliminat\w*", r"\bprevent\w*",
          r"\breduc\w*", r"\bcut\w*", r"\bless\b", r"\bfewer\b", r"\bsidestep\w*", r"\bbypass\w*", r"\bspare\w*",
          r"\bomit\w*", r"\bdrop\w*", r"少(了)?(?=算|计算|重算|重复)", r"省去", r"避免", r"减少", r"节省", r"节约", r"免去", r"省掉", r"省了", r"(?<![节])省", r"跳过", r"免得", r"以免", r"省得",
          r"降低", r"变少", r"(?<!不)少了", r"更少", r"变小", r"减小", r"下降", r"(降|减)(到|为|至)"]
_RECOMP = [r"re-?\s?comput\w*", r"re-?calculat\w*", r"\bre-?do(ne|ing|es)?\b", r"\bredid\b", r"\bre-?run\w*",
           r"\bre-?process\w*", r"\bre-?encod\w*",
           r"\b(comput|calculat|process|encod|run|work|produc|generat|creat|build|rebuil)\w*\s+(\w+\s+){0,6}?(again|twice|from scratch|each time|"
           r"every time|over and over|repeatedly)", r"\b(comput|calculat)\w*\s+(\w+\s+){0,3}?(anew)",
           r"\bredundant\w*", r"\brepeat\w*\s+(\w+\s+){0,1}(comput\w*|work|calculat\w*)", r"\bwasted?\s+work",
           r"\b(work|computation|calculation|math|k/v|kv|keys|values)\s+(\w+\s+){0,3}?(repeated|redone|recomputed|recalculated)\b",
           r"重复计算", r"重新计算", r"重算", r"从头(计算|算)", r"再算", r"再次计算", r"反复计算", r"重复运算", r"冗余计算",
           r"重新算", r"重复算", r"再计算", r"(重新|再)[^，。；,;]{0,16}(过|跑|算|走)一?遍", r"\brebuil\w*", r"(重新|重复|再次?)[^，。；,;]{0,6}(计算|算|处理)",
           r"(重新|重复|再次)\s*[A-Za-z][^，。；,;]{0,12}的?(计算|运算)", r"重做|(重新|重复|再次?)\s*(做|跑|走)\s*[一1]?\s*(次|遍)",
           r"(重新|重复|再次?)\s*(re-?)?(comput\w*|calculat\w*|process\w*)",
           r"(重新|重复|再次?)[^，。；,;]{0,8}(投影|前向|编码)",
           # the computing named by its English term inside Chinese: "省得对 prefix 重新做 projection", "不再对老 token 做 matmul"
           r"(重新|重复|再次?)[^，。；,;]{0,12}(做|跑|算|过)?\s*(projection|project\w*|forward|fwd|matmul|gemm|attention|attn|encod\w*)\b",
           r"\bre-?(project|deriv|evaluat|materializ|materialis)\w*",
           # "no need to compute (it) again": the plain verb under a need-negator is the idea ("下次不用算了")
           r"(不用|不必|无需|无须|不需要|用不着)(再|重新|重复)?(去)?(算|计算)",
           r"(计算|运算)\s*[:：]?\s*(不|没有|无需|不用)\s*(重复|重新|再)",  # "计算：不重复"
           r"\b(no need to|don't (have|need) to|doesn't (have|need) to|needn't)\s+(re-?)?(comput|calculat)\w*",
           # the cost of recomputing, named by its growth: "without it, decode would be quadratic"
           r"\bquadratic\b", r"平方级|平方复杂度"]
_REUSE = [r"\bre-?us(e|es|ed|ing)\b", r"复用", r"拿来用", r"直接(拿|读|取)",
          # memory traded for *compute* names the saving; for speed or time it names only the effect (labelled 1)
          r"\btrad\w*\s*[:：]?\s+(\w+\s+){0,2}?(memory|space|vram|storage)\s+for\s+(\w+\s+)?(compute|computation|flops)",
          # computed once, never again: "old tokens' K/V computed once and kept", "每个 token 的 K/V 只算一次"
          r"\b(computed|calculated|projected|encoded)\s+(only\s+|just\s+)?once\b(?!\s+(per|every|each|a)\s+(step|token|iteration|round))",
          r"只(需要?|要)?(算|计算)\s*(一次|一遍)(?!\s*(前向|forward))",
          # computed before, used directly later: "算过的 K/V 留在显存，后面直接拼上去用"
          r"(算过|算好|算出来?|计算过|计算好|算完)的[^，。；,;]{0,16}(直接|接着|拿来|照样)[^，。；,;不没]{0,6}用",
          # the cost of recomputing said under "if": "如果每步都把整段历史重新过一遍会慢死", "if every step redid the prefix it would crawl"
          r"(如果|要是|假如|假设|若)[^，。；,;]{0,20}((重新|重复|再)[^，。；,;]{0,16}(过|跑|算|走)一?遍|重算|重新(计)?算|从头(计)?算)"
          r"[^，。；,;]{0,16}(慢|浪费|白费|卡死|吃不消|受不了)",
          r"\bif\b[^.;]{0,40}\b(recomput\w*|recalculat\w*|re-?ran|re-?run\w*|redo(es|ing)?|redid)\b[^.;]{0,40}\b(would|'d)\s+(\w+\s+)?"
          r"(be\s+)?(slow|crawl|wasteful|waste|expensive|quadratic)\w*",
          r"\b(memory|space)\s+for\s+(compute|computation)\b",
          r"O_of_n\^?2[^，。；,;]{0,16}(O_of_n\b|linear|线性)", r"O_of_n\b[^，。；,;]{0,20}(instead of|rather than|而不是|而非)\s*O_of_n\^?2", r"\bquadratic\b[^.;]{0,30}\blinear\b", r"(以|用|拿)?(显存|空间|内存|存储)换(计算|算力)", r"重用", r"重复利用", r"直接用", r"直接使用",
          r"\b(only|just|merely)\s+(\w+\s+){0,3}?(the\s+)?(new|newest|latest|last|current|one)\s+(\w+\s+)?tokens?",
          r"\b(work|compute|computation)\s+for\s+(one|a single|the new|the newest|the latest)\s+token\b",
          r"(计算|计算量|运算|算力)[^，。；,;]{0,16}只(跟|和|与)[^，。；,;]{0,4}(新|最新|当前)", r"\bonly\s+depends?\s+on\s+the\s+(new|newest|latest|current)\b",
          r"\bonly\s+(\w+\s+){0,2}?(one|a single)\s+new\b",
          # the saving named by its contrast with starting over: "incremental rather than from scratch"
          r"\b(rather than|instead of|not)\s+(\w+\s+){0,2}?(from scratch|all over again|starting over)\b",
          # "instead of re-hashing the whole repo", "不用每集都从第一集重刷": not redoing all of it from the start
          r"\b(instead of|rather than)\s+re-?(hash|scan|read|process|encod|comput|calculat|run|do|play|watch|build|deriv|evaluat)\w*"
          r"\s+(\w+\s+){0,1}?(the\s+)?(whole|entire|full)\b",
          r"(而不是|而非|不用|不必|无需|用不着|不需要)[^，。；,;]{0,8}从(头|零|第一|开头|最开始)[^，。；,;]{0,6}(重新|重|再)[\u4e00-\u9fff]",

          r"\b(new|newest|latest|current)\s+tokens?\s+only\b", r"\bonly\s+(needs?|has|have)\s+(\w+\s+){0,2}?own\b",
          r"\b(come|comes|read|reads|taken|fetched|loaded|pulled|looked up|grabbed|retrieved|fished out)\s+(straight\s+|directly\s+)?from\s+(the\s+)?(kv\s+)?cache",
          r"(从|在)(KV ?)?缓存(里|中)?(直接)?(读|取|拿|捞|调|拉)",
          # the past tokens' part taken from the cache: "之前的 k v 拿缓存的"
          r"(之前|前面|以前|历史|过去|老|旧)的?[^，。；,;]{0,14}(直接)?(拿|读|取)\s*(缓存|cache)", r"(算|计算)一次就(存|保存|缓存)",
          # "每步只喂新 token", "只把新 token 送进去": only the new token goes through the model
          r"只(需要?|要|用)?(把)?(喂|输入|送|传|过|投影|前向)[^，。；,;]{0,6}(新|最新|当前|最后|最近)",
          # "老 token 的 KV 直接拼上去接着用": the old tokens' KV used on, not made again
          r"(KV|kv|缓存|cache|老|旧|历史|之前|前面)[^，。；,;]{0,14}(接着|继续|照样|反复)(用|使用)",
          # "llama_decode only evals the new one"
          r"\b(only|just)\s+(\w+\s+){0,3}?(the\s+)?(new|newest|latest|current)\s+one\b",
          r"只(需要?|要|用)?(计算|算|处理|跑)[^，。；,;]{0,6}(新|最新|当前|最后|最近)", r"只(需|要|用)?(计算|算|处理)(它|它们)?自己", r"每(一)?步只(需|要)?(计算|算|处理|跑)"]

RECOMPUTE = idea(
    "no_recompute", "it avoids recomputing the tokens already processed", "它避免了对已处理 token 的重复计算",
    parts=[_COMPUTE, _AVOID], inverted=_RECOMP, standalone=_REUSE, inverted_by=_AVOID,
    # "prefill 的时候算一次 KV，decode 就一直用": computed once in one clause, used from then on in the next
    # "K/V 算一次存一次，后面 decode 白嫖": used for free from then on
    across=[r"(算过|算好|算出来?|计算过|计算好|算完)的[^，。；,;]{0,16}，\s*[^，。；,;]{0,8}(直接|接着|拿来|照样)[^，。；,;不没]{0,6}用",
            r"(算|计算|存)\s*(一次|一遍)[^，。；,;]{0,12}，\s*[^，。；,;]{0,12}((一直|反复|直接|都|就)[^，。；,;]{0,3}(用|使用|读|拿)|白嫖|白拿|白用|免费(用|拿|读))",
            r"\b(computed|calculated|done)\s+(only\s+|just\s+)?once\b[^.;，]{0,20}，\s*[^.;，]{0,30}\b(for free|free of charge)\b"],
    weak=[r"\b(fast\w*|speed\w*|quick\w*|accelerat\w*|latency|efficien\w*)\b", r"加速|更快|提速|加快|速度|快"])

_MEM = [r"\bmemory\b", r"\bmem\b", r"\bvram\b", r"\bhbm\b", r"\bram\b", r"\bstorage\b", r"\bfootprint\b", r"\bspace\b", r"\bsize\b",
        r"\bcapacity\b", r"\bbuffers?\b", r"缓冲区", r"显存", r"内存", r"存储", r"大小", r"(?<![上时])空间", r"容量",
        r"\b\d*\s*(gb|gib|mb|mib|tb)\b", r"\b(giga|mega|tera)bytes?\b"]  # memory named by its unit: "takes gigabytes"
_COST = [r"\bcost\w*", r"\bconsum\w*", r"\bus(e|es|ed|ing|age)\b", r"\btak(e|es|ing)\b", r"\boccup\w*", r"\beat\w*",
         r"\bgrow\w*", r"\bincreas\w*", r"\bris(e|es|ing)\b", r"\bclimb\w*", r"\bheav\w*", r"\bpressure\b",
         r"\bexpensive\b", r"\bburden\w*", r"\bbound\b", r"\blimit\w*", r"\bfill\w*", r"\bmore\b", r"\blots\b",
         r"\blarge\w*", r"\bbig\w*", r"\bscal\w*", r"\blinear\w*", r"\bproportional\b", r"\bbottleneck\w*",
         r"\bbudget\b", r"\bspend\w*", r"\bprice\b", r"\bbills?\b", r"(?<![开雪烟火浪])花(?![样式招哨])", r"\btrad(e|es|ing)\b", r"\btrade-?off\b", r"\bhungry\b",
         r"\bintensive\b", r"\bdemand\w*", r"\bneed\w*", r"\brequir\w*", r"\bhog\w*", r"\baccumulat\w*",
         r"\bballoon\w*", r"\bswell\w*", r"\bexpand\w*", r"\bpil(e|es|ing)\s+up\b", r"(往上|越来越|越)堆|堆(积|起来|上去|满)", r"↑", r"⬆", r"∝", r"\bextra\b", r"\boverhead\b", r"\bpa(y|ys|id|ying)\b", r"\bhold\w*",
         r"\brun\w*\s+out\b", r"\bloss\b", r"\bdownside\w*", r"\bdrawback\w*", r"\bthe catch\b", r"\bpenalty\b", r"缺点|坏处|副作用|牺牲", r"\bexhaust\w*", r"\boom\b", r"\bconcern\w*", r"\bissue\b", r"\bproblem\w*", r"\bnot free\b", r"\bsit\b", r"\bkeeps? growing\b",
         r"占用", r"占(?!位)", r"消耗", r"压力", r"增加", r"增长", r"成长", r"增大", r"变大", r"上升", r"吃", r"开销", r"代价", r"成本",
         r"负担", r"紧张", r"不够", r"不足", r"瓶颈", r"越来越", r"膨胀", r"更多", r"大量", r"很多", r"线性", r"正比", r"涨", r"往上(走|窜|飙|冲|爬)|一路(上涨|走高|飙升|往上)|飙升|水涨船高",
         r"换", r"越多", r"越大", r"耗", r"翻倍", r"加倍", r"\bdoubl\w*", r"变多", r"增多", r"(?<![免])费(?!用)", r"\bper (token|sequence|request|step)\b", r"\bO\(\w+\)", r"\bO_of_\w+"]
MEMORY = idea(
    "memory_cost", "it costs memory that grows", "它要占用显存，而且随长度和请求数增长",
    parts=[_MEM, _COST], opposite=True,
    inverted=[r"\b(sav|reduc|lower|decreas|shrink|conserv)\w*\s+(\w+\s+){0,2}?(gpu\s+)?(memory|vram)\b",
              r"\b(memory|vram|space|storage)\b[^.;,]{0,12}\bfree\b", r"(显存|内存)[^，。；,;]{0,4}免费",
              r"(节省|节约|减少|降低)[^，。；,;]{0,3}(显存|内存)"],
    standalone=[r"\bmemory[- ]bound\b", r"\bmemory pressure\b", r"显存压力", r"以显存换", r"用显存换",
                r"\b(its|the|cache)\s+(size|footprint|usage)\s+(\w+\s+){0,2}?(grows?|growing|increases?|scales?|rises?)\b",
                r"占用(量)?[^，。；,;]{0,12}(增长|增加|增大|变大|越来越|上升|膨胀|线性)",
                r"\b(cache|it|kv|structure|store|buffer|table|state|memo)\s+(\w+\s+){0,2}(grows?|growing|swell\w*|(gets?|getting) "
                r"(bigger|larger|huge|big|large|enormous)|balloons?|expands?)\b",
                r"(缓存|KV)[^，。；,;]{0,8}(多一份|多出|变多|增多|越多)",
                r"\bout of (gpu\s+)?memory\b", r"\boom\b",
                r"\b(size|memory|footprint)\b[^.;]{0,40}\bdepends?\s+on\b[^.;]{0,50}\b(length|tokens?|context)\b",
                r"额外(的)?(显存|内存|存储)|显存开销|(显存|内存)[^，。；,;]{0,10}(有关|相关|成正比)", r"爆显存|显存(不够|不足|溢出|耗尽)",
                r"\bfill\w*\s+(up\s+)?(the\s+)?(gpu|card|device)\b", r"\b(gpu|card)\s+fills?\s+up\b", r"占(地方|空间|位置)|显存(被)?(占满|吃满)",
                r"(显存|内存)[^，。；,;]{0,4}(被|给)\s*(塞|占|吃|撑|挤|填)满",
                r"(缓存|KV)[^，。；,;]{0,16}(越来越大|增长|变大|膨胀|越大|越多|更大|更多|成正比|正比|线性|(?<![不没])涨)",
                # the size follows the length: "n_ctx 开多大 KV 就预留多大", "上下文多长，缓存就有多长"
                r"(多大|多长|多少)[^，。；,;]{0,12}(KV|缓存|显存|内存)[^，。；,;]{0,6}(多大|多长|多少)",
                r"(缓存|KV)[^，。；,;]{0,8}(非常|很|特别|超|巨|极)大",
                # the cache named by a pronoun, as "it grows" is in English: "长对话、多用户都会让它变大"
                r"它((?![不没])[^，。；,;]){0,4}(变大|变多|越来越大|越来越多|膨胀|增长|撑大|涨)", r"(显存|内存)(大户|杀手|黑洞)",
                r"(显存|内存)[^，。；,;]{0,6}(吃紧|扛不住|撑不住|顶不住|吃不消|hold ?不住|放不下)",
                # the card blown up by it (slang for running out of memory): "很容易把卡撑爆", "blows up the GPU"
                r"(显?卡|GPU|gpu|显存|内存)(给)?(撑|挤|塞)(爆|满)|撑爆|爆卡",
                r"\b(blow|blows|blew|blown|blowing)\s+(up\s+)?(the\s+)?(gpu|card|vram)\b", r"\b(gpu|card|vram)\s+(blows?|blew)\s+up\b",
                # a shape or size formula with the length as a factor (concepts.shape_as_product): "[batch × max_len × …] buffer"
                r"\b(buffer|cache|size|memory|footprint|cost)\b[^.;，]{0,40}(?<![\w])(max_len|max_seq_len|seq_len|seqlen|n_ctx|context_len|"
                r"sequence length|序列长度|seq_length)\s*[×*]|[×*]\s*(max_len|max_seq_len|seq_len|seqlen|n_ctx|context_len|sequence length|"
                r"序列长度|seq_length)\b[^.;，]{0,40}\b(buffer|cache)\b",
                r"(大小|size|显存|内存|缓存|KV)[^，。；,;]{0,40}[×*]\s*(序列长度|序列长|seq_len|max_len|token ?数)"],
    # "It's no memory saver, quite the reverse", "不省显存，恰恰相反": the saving denied and turned round is the cost
    across=[r"(多大|多长|多少)[^，。；,;]{0,12}，\s*[^，。；,;]{0,4}(KV|缓存|显存|内存)[^，。；,;]{0,6}(多大|多长|多少)",  # "上下文开多大，KV 就占多大"
            r"(缓存|KV|显存|内存)[^，。；,;]{0,16}，\s*[^，。；,;]{0,10}(越[^，。；,;]{1,4}越(多|大)|吃紧|紧张|扛不住|顶不住|吃不消|撑不住|放不下|不够用?)",
            r"\b(no|not\s+a)\s+(memory|vram|space)[- ]?savers?\s*，\s*(quite\s+|just\s+|rather\s+|in fact\s+)?the\s+(reverse|opposite|contrary)\b",
            r"(不|并不|不会)(省|节省|节约)(显存|内存)[^，。；,;]{0,4}，\s*(恰恰|正好|刚好|正)?相反"],
    # the predicate in the next clause, its subject left out: "缓存要放显存里，聊得越久越多", "…留显存，长文本时很吃紧"
    weak=_MEM)

_JOIN = [r"\bappend\w*", r"\badd\w*", r"\bjoin\w*", r"\bbecom\w*", r"\bfe[ed]\w*\s+back\b", r"\bfed\b", r"\bfeed\w*",
         r"\bgo(es)?\s+(back\s+)?in(to)?\b", r"\benter\w*", r"\bwritten\b", r"\bwrit\w*", r"\bconcat\w*",
         r"\bpart of\b", r"\binsert\w*", r"\btorch\.(cat|concat\w*)\b", r"(?<![A-Za-z])cat\s*(到|进|回)", r"\b(tack|stuck|stick|glue|tag|slap)\w*\s+(it\s+)?(on|onto)\b", r"\bextend\w*", r"\b(land(s|ed|ing)?|ends?\s+up|ended\s+up)\s+(back\s+)?(in|into|on)\b", r"\bpush\w*", r"\bput\b", r"\binclud\w*", r"\bturn\w* into\b",
         r"\bused as\b", r"\bserves? as\b", r"\battach\w*", r"\bstays? in\b", r"\bstored\b", r"\bsaved\b", r"\brecorded\b",
         r"追加", r"加入", r"进入", r"拼接", r"拼到", r"成为", r"变成", r"写入", r"放入", r"放回", r"并入", r"加到", r"添加",
         r"接到", r"接入", r"(贴|粘|挂|落)(到|在|进|回|入)", r"融入", r"作为", r"回到", r"加在", r"append", r"存入", r"存进", r"写回", r"回写", r"放到",
         r"接在", r"附加", r"拼在", r"送回", r"喂回", r"输回", r"(写|加|放|存|塞|并|拼)进", r"进到",
         r"成了", r"变为", r"当成", r"当作", r"的一部分", r"存到", r"放进", r"记(到|入|进)", r"留在", r"保留在", r"(拼|加|接|塞|存)回", r"进(了)?(历史|上下文|序列|输入|缓存|KV)",
         r"(在|位于|存在)(历史|上下文|序列|输入|缓存|KV)\s*(里|中|当中)"]
_HIST = [r"\bhistor\w*", r"\bcontext\b", r"\bsequences?\b", r"\binput\b", r"\bprompt\b", r"\bkv\b", r"\bcache\b",
         r"\btoken\s+(list|ids)\b", r"\blist of tokens\b", r"token\s*列表", r"\b(input|token)_?ids\b",
         # the request's token list by its name in code: output_ids, generated_tokens, all_token_ids, seq.tokens
         r"\b(output|generated|all_token|completion|prompt)_?(ids|tokens)\b", r"\b(req|request|seq|sequence)\.(\w*_)?(ids|tokens)\b", r"\b\w+_token_ids\b",
         r"\bstate\b", r"\bprefix\b", r"\bconversation\b", r"\btext so far\b", r"\bso far\b", r"\bback\b",
         r"历史", r"上下文", r"序列", r"输入", r"状态", r"前缀", r"KV", r"缓存", r"context", r"history"]
# the sampled token named among the past tokens the next step reads; SEP is what joins the two halves
_AMONG_PAST_EN = (r"\b(previous|prior|earlier|past|preceding)\s+(\w+\s+){0,2}?tokens?SEP(including|incl\.?|plus)\s+(the\s+)?"
                  r"(just[- ]|newly\s+)?(sampled|chosen|picked|selected|new)\s+(one|token|id)\b")
_AMONG_PAST_ZH = r"(之前|前面|以前|历史|已有)[^，。；,;]{0,6}(token|词|字)SEP(包括|连同|加上)[^，。；,;]{0,3}(刚|新)[^，。；,;]{0,2}(采样|选|生成|挑)"
_ARROW_ON = r"(?=[^→⇒>]*$|.*(\b(read|use|see|attend|depend|condition|feed|build|comput|take|predict)\w*|读|用|看|依赖|基于|算))"
TOKEN_TO_HISTORY = idea(
    "token_to_history", "the sampled token is appended to the request's history", "采样出的 token 会加入请求的历史（上下文）",
    parts=[_HIST, _JOIN],  # the subject is often in the clause before ("… 不会被丢弃，而是追加到历史里")
    standalone=[r"\b(output|token|result|sample)s?\b\s+(\w+\s+){0,4}?(is|becomes|serves as|used as)\s+([\w']+\s+){0,3}?input\b",
                r"\b(token|it|choice|sample)('s|\s+(is|gets|was))\s+(then\s+)?(appended|fed back|added back|concatenated)\b",
                r"(作为|成为|当作|当成)[^，。；]{0,8}(输入|条件|依据)", r"以\s*(它|这个\s*token|该\s*token|此|这个词)\s*(作)?为[^，。；,;]{0,4}输入",
                # the token changes what later steps see: it is in their context
                r"\b(sees?|gets?|has|have)\s+(a\s+)?(different|changed|new)\s+(context|history|input)\b",
                r"\b(context|history|input)\s+(is\s+|becomes\s+)?(different|changes|changed)\b",
                r"(上下文|历史|输入)[^，。；,;]{0,3}(不同|不一样|变了|改变|变化)",
                r"(改变|改了|决定)[^，。；,;]{0,8}(上下文|历史|输入|(看到|读到)的(内容|东西|序列))",
                r"\bchang\w*\s+(the\s+)?(context|history|input)\b",
                r"\bchang\w*\s+what('s|\s+is)\s+in\s+(the\s+)?(kv\s+)?(context|history|input|cache|sequence)\b", r"(就是|便是|成了|成为)[^，。；,;]{0,8}的?(条件|依据)",
                # where it goes, named by place: the end of the sequence, the model's input
                r"(接|拼|加|放|追加|附)(在|到)[^，。；,;]{0,4}(后面|末尾|最后|尾部)", r"(喂|送|输|传)(给|回|进)[^，。；,;]{0,4}模型", r"回到[^，。；,;]{0,2}模型",
                r"(就是|便是|变成|成了)[^，。；,;]{0,8}的?输入", r"(?<!不)(是|为)[^，。；,;]{0,12}的输入", r"\b(added|appended|tacked)\s+(on\s+)?to\s+the\s+end\b",
                r"\bfe(d|eds?)\s+(back\s+)?(in)?to\s+the\s+model\b",
                # an arrow from the token to the history is "goes into" ("picked token -> context -> next step reads it"),
                # when the chain is a statement: its last arrow, or a verb further on (a bare chain of nouns is keywords)
                r"\b(tokens?|ids?|it|choices?|samples?)\s*(->|→|=>|⇒)\s*(the\s+)?(context|history|input|sequence|prefix|kv|cache|"
                r"\w*_?ids)\b" + _ARROW_ON, r"(token|它)\s*(->|→|=>|⇒)\s*(上下文|历史|输入|序列|KV|缓存)" + _ARROW_ON,
                r"(包含|含有|带着|带上|加上)[^，。；,;]{0,6}(token|它|这个词|这个字)[^，。；,;]{0,3}的(上下文|序列|历史|输入)",
                r"\b(context|history|sequence|input)\s+(that\s+|which\s+)?(now\s+)?(contains?|includ\w+|with)\s+(it|that token|the (sampled|chosen|picked) token)\b",
                # it is one of the tokens the next step reads: "depends on all previous tokens including the sampled one"
                _AMONG_PAST_EN.replace("SEP", r"\s+"), _AMONG_PAST_ZH.replace("SEP", ""),
                # it goes into the later computation itself
                r"(进|进入|进到|加入|用于|参与)[^，。；,;]{0,2}(后续|之后|后面|下一步)的?(计算|生成|步骤|decode|前向)",
                r"\b(goes|fed|feeds|enters?)\s+(back\s+)?into\s+(the\s+)?(next|later|following|subsequent)\b"],
    weak=[r"\bhistor\w*\b|\bcontext\b", r"历史|上下文"],
    across=[_AMONG_PAST_EN.replace("SEP", r"\s*，\s*"), _AMONG_PAST_ZH.replace("SEP", r"\s*，\s*")])  # "…tokens, including it"

_NEXT = [r"\b(?!next\s+tokens?\b)(next|later|following|subsequent|future|upcoming|rest of)\s+(\w+\s+){0,2}?(steps?|decod\w*|rounds?|tokens?|inputs?|"
         r"iterations?|forward|pass(es)?|generation|outputs?|predictions?|distributions?|computation|continuation)",
         r"\b(later|next|following|subsequent)\s+(one|ones)\b", r"\blater\b\s+(steps?|on)\b",
         r"\b(path|trajectory|direction|branch)\b", r"\bfeedback loop\b",
         r"\bfrom then on\b", r"\bafterwards\b", r"\bthereafter\b", r"\bdownstream\b", r"\bwhat comes (next|after)\b",
         r"\beverything after\b", r"\b(everything|anything|whatever|tokens?|words?|text)\s+(that\s+)?(is\s+|are\s+|gets?\s+)?"
         r"(generated|produced|sampled|predicted|written|comes?|coming)\s+after\s+(it|that|this|them)\b", r"\bcondition\w*\b", r"\bdepend\w*", r"\bbuilds?\s+on\b", r"\bbased on\b", r"\bcontinuations\b",
         r"\brel(y|ies)\s+on\b", r"\battends? to\b", r"\bsteer\w*", r"\bdiverg\w*", r"\bcontinuation\b",
         r"下一(轮|步|个|次)", r"后续", r"(之后|以后|后面)(的)?[^，。；,;]{0,3}(每一?步|步|token|计算|生成|输出|解码|decode|内容|路径|轮|预测|都)",
         r"(影响|决定|改变|左右)[^，。；,;]{0,2}(之后|以后|后面)", r"接下来", r"路径", r"走向", r"轨迹", r"方向",
         r"依赖", r"基于", r"为条件", r"depend", r"next step", r"(顺着|接着|沿着)(它|这个)", r"(接着|顺着|沿着)[^，。；,;]{0,4}(往后|往下|继续)",
         r"\b(generat\w*|produc\w*|predict\w*|comes?|outputs?)\s+next\b", r"(影响|决定|改变)[^，。；,;]{0,3}(每一步|后面每|之后每)(?!的?\s*(概率)?\s*(分布|logits?))",
         r"(后面|之后|接下来)[^，。；,;]{0,6}(顺着|沿着|跟着|接着)",
         # one changed, all that follows differs: "换一张开头后面全不一样"
         r"(之后|以后|后面|后续)的?[^，。；,;]{0,2}全(都|部)?(不一样|不同|变了|跟着变|改变|变)"]
NEXT_STEP_DEPENDS = idea(
    "next_step_depends", "every later step is computed from that token", "之后的每一步都基于这个 token 计算",
    standalone=_NEXT + [r"\b(comput|calculat|condition|predict|generat|decod|continu)\w*\s+(from|on)\s+(it|that|this|them|there)\b",
                        r"\b(every|each|all|any)\s+(\w+\s+)?(steps?|tokens?|decod\w*|iterations?|passes?|predictions?)\s+"
                        r"(that\s+)?(after|following|follows?|comes? after)\b",
                        r"\b(continu\w*|carr(y|ies) on|goes on|builds?)\s+from\s+(it|that|this|there)\b", r"\bcontinu\w*\s+from\b",
                        r"\b(computed|calculated|conditioned|predicted)\s+(from|on)\s+(the\s+)?(\w+\s+){0,2}?(tokens?|samples?|choices?)\b",
                        r"\binput\s+(of|for|to)\s+(the\s+)?(next|following|later)\b", r"(下一步|后面|之后)[^，。；]{0,4}(的)?输入",
                        r"(再|又|重新)\s*(送|喂|输|传|放)(进|回|给|入)[^，。；,;]{0,4}模型"],
    # "LLMs are autoregressive" names the property, not what follows from the token: a hint, not the idea
    weak=[r"\bautoregress\w*", r"自回归"])

REQUEST_STATE = idea(
    "request_state", "it is execution state that belongs to one live request", "它是属于某一个活跃请求的执行状态",
    # "it only exists while its request runs": "while" opens the next clause
    across=[r"\bonly\s+(exists?|lives?|lasts?|stays?)\s*(around\s*)?，\s*(the|its|that|a|one)\s+(own\s+)?request\b",
            r"请求[^，。；,;]{0,4}(结束|完成|释放)[^，。；,;]{0,2}，\s*[^，。；,;]{0,10}(被)?(回收|释放|清掉|清空|销毁|删除|归还|没了|消失)"],
    standalone=[r"\b(per|each|every|its own|their own|one|a specific|the specific|bound|tied|belong\w*|owned|attached|"
                r"specific|that|this|the|running|live|active)\W+(\w+\W+){0,3}?(live\s+|active\s+|running\s+)?"
                r"(requests?|sequences?)('s)?\b(?!\s+(with|for)\s+the same)",
                r"\bexecution state\b", r"\bworking state\b", r"\bintermediate\s+(state|results?|activations?)",
                r"\bactivations?\b", r"\battention state\b", r"\bits own tokens\b",
                r"每个(活跃)?请求", r"绑定", r"执行状态", r"请求(自己|自身|本身)", r"自己的", r"属于[^，。；,;]{0,12}请求", r"(那个|这一个|那一个|单一|当前)请求",
                r"(正在运行|运行中|活跃)的[^，。；,;]{0,4}请求",
                r"中间(计算|运算)?(状态|结果|值|量)", r"按(每个|单个)?请求", r"活跃请求", r"请求[^，。；,;]{0,10}的(状态|中间结果)", r"跟着(这个|该|那个)?请求",
                r"请求[^，。；,;]{0,6}(结束|没了|释放)[^，。；]{0,8}(它|缓存|KV)[^，。；,;]{0,4}(也)?(就)?(没了|释放|消失|清掉)",
                r"\b(goes away|dies|is freed|is dropped|disappears)\s+with\s+(the|its|that)\s+request\b",
                r"请求[^，。；,;]{0,4}(结束|完成|释放)[^，。；,;]{0,3}(就|便|后|时)[^，。；,;]{0,3}(被)?(回收|释放|清掉|清空|销毁|删除|归还|没了|消失)",
                r"(只|仅)(在|于)[^，。；,;]{0,6}请求[^，。；,;]{0,6}(期间|的时候|时|过程中)",
                r"\bonly\s+(exists?|lives?|lasts?)\s+(while|as long as|during)\s+(the|its|that|a)\s+request\b", r"运行状态", r"激活值", r"这个请求", r"该请求", r"单个[^，。；,;]{0,4}请求",
                # the request named in English inside Chinese: "存着这个 request 每个 token 的 key 和 value"
                r"(这个|该|那个|当前|每个|单个|某个)\s*(request|req|sequence)\b"])
SAMPLING_PICKS = idea(
    "sampling_picks", "sampling picks every token", "采样决定每一个 token",
    standalone=[r"\b(picks?|chooses?|selects?|decides?|determin\w*)\s+(\w+\s+){0,3}?(every|each|the next|which)\s+"
                r"(\w+\s+){0,2}?tokens?", r"每一?个 ?token", r"决定[^，。；,;]{0,6}(token|哪个|下一)"])
# the two phases by the names other engines and the Chinese text give them: TensorRT-LLM's context and generation
# phases, 预填充 and 解码 ("context 阶段把 prompt 的 KV 写进 cache，generation 阶段就在这份 KV 上往后生成")
_PREFILL_EN = r"(?:prefill\w*|context\s+(?:phase|stage)|prompt\s+(?:processing|phase))"
_PREFILL_ZH = r"(?:prefill|context\s*(?:phase|stage|阶段)|预填充|预填|上下文阶段)"
_DECODE_EN = r"(?:decod\w*|generation\s+(?:phase|stage))"
_DECODE_ZH = r"(?:decode|generation\s*(?:phase|stage|阶段)|解码|生成阶段)"
PREFILL_BUILDS = idea(
    "prefill_builds", "prefill builds the request's state", "prefill 建立请求的状态",
    standalone=[_PREFILL_EN + r"\s+(\w+\s+){0,5}?(build\w*|creat\w*|fill\w*|writ\w*|wrote|produc\w*|populat\w*|set\w*\s+up|"
                r"comput\w*|prepar\w*|establish\w*|stor\w*|generat\w*)",
                r"(that|which)\s+prefill\s+(wrote|built|created|filled|computed|produced)",
                _PREFILL_ZH + r"[^。；;]{0,18}(建立|构建|建好|建起|搭好|生成|写入|写进|存进|放进|写好|填充|填好|准备|计算|得到|算好|算出|存好|留下|产生|存下)",
                # "prefill 算完 prompt 的 KV": finished computing it, the state named after the verb
                _PREFILL_ZH + r"[^。；;]{0,6}(算完|跑完|做完|处理完)[^，。；,;]{0,10}(KV|kv|缓存|cache|状态)"])
DECODE_CONTINUES = idea(
    "decode_continues", "decode continues from that same state", "decode 在同一份状态上继续",
    # the gap crosses "doesn't" so that "decode doesn't continue from it" is read, and read as negated
    standalone=[_DECODE_EN + r"\s+([\w']+\s+){0,5}?(continu\w*|reus\w*|build\w*|extend\w*|read\w*|us(e|es|ing)|start\w*|"
                r"resum\w*|append\w*|mov\w*|picks? up|carr\w*)",
                _DECODE_ZH + r"[^。；;]{0,18}(继续|沿着|复用|基于|接着|读取|使用|延续|接续|在同一|(?<![不没])用|(?<![不没])读(?!不)|往(后|下|前|上)(走|推|跑|算|生成|加|叠|堆|滚|续|写))",
                r"decod\w*\s+(\w+\s+){0,3}?(goes|go|going|went|steps?|walks?|marche?s?)\s+(forward|onward|ahead)\s+(from|on)\b",
                r"接着[^。；;]{0,16}(往下|继续|走|生成)",
                _DECODE_ZH + r"[^。；;]{0,6}(离不开|依赖|依靠|靠着?|用的是|要用|得用)\s*(prefill|预填充?|之前|前面)?[^，。；,;]{0,10}(状态|KV|kv|缓存|cache)", r"\bcontinu\w*\s+from\s+(the|that|this)\s+(\w+\s+){0,2}?(cache|state)",
                r"\b(same|one|single)\s+(\w+\s+){0,2}?(state machine|cache)", r"\bwhere prefill left off\b",
                r"同一(个|条|份)?\s*(状态机|缓存|状态|KV|kv)",
                r"从[^，。；,;]{0,14}(状态|缓存|KV)[^，。；,;]{0,6}(继续|接着|往下|推进)",
                r"在[^，。；,;]{0,14}(状态|缓存|KV|kv|cache|state)\s*(上|里|中)\s*(继续|接着|往下|往后|推进)",
                r"\b(continu\w*|resum\w*|picks? up|carr(y|ies) on)\s+from\s+(\w+\s+){0,4}?(state|cache|kv)\b",
                # "decode just keeps going from prefill's KV", "goes on from where prefill stopped"
                r"decod\w*\s+(\w+\s+){0,3}?(keeps?\s+going|kept\s+going|goes\s+on|went\s+on|proceeds?|moves?\s+on)\s+(from|with)\b"],
    weak=[r"\b(same|one|single)\s+(\w+\s+){0,2}?(request|lifecycle|life cycle|sequence|path)", r"\bthis very request\b",
          r"同一(个|条)?(请求|生命周期)", r"一条(生命周期|链路)"])

HIT_MISS = misconception(
    "hit_miss",
    [r"\bhits?\s*(/|or|and|-)\s*miss", r"\b(cache|on a|a|the)\s+(hit|miss)(es)?\b", r"\bhit\s+(rate|ratio)",
     r"\b(look\w*\s+up|lookup)\s+(\w+\s+){0,3}?(answers?|responses?|replies|completions?|queries|questions)",
     r"(stor|sav|remember|reus|return|serv)\w*\s+(\w+\s+){0,3}?(previous|past|earlier|old|prior|cached|stored)\s+"
     r"(answers?|responses?|replies|completions?)",
     r"(same|identical|repeated)\s+(prompts?|questions?|query|queries|requests?)\b[^.;!?]{0,40}(return|serv|answer|"
     r"skip|fast|instant)",
     r"\blru\b", r"\b(cache[sd]?|fill\w*|stor\w*|remember\w*|keep\w*)\b[^.;]{0,30}\b(answers|responses|replies|completions)\b",
     r"命中", r"缓存(了)?((?!不|没|并非)[^。；;，,]){0,6}(答案|回答|回复)",  # "缓存不是查答案的" denies it r"(返回|复用)[^。；;，,]{0,6}(之前|以前)的?(答案|回答|回复)",
     r"(相同|同样|重复)的?(问题|请求|提示)[^。；;]{0,10}(直接|返回)", r"查表"],
    ["no_recompute"],
    "the KV cache is not a hit/miss cache of answers: it exists only while its own request runs",
    "KV Cache 不是按命中/未命中查答案的缓存：它只在自己的请求运行时存在")
SAVES_MEMORY = misconception(
    "saves_memory",
    [r"\b(sav\w*|reduc\w*|lower\w*|decreas\w*|cut\w*|shrink\w*|conserv\w*|less|lighter)\s+(\w+\s+){0,2}?(gpu\s+)?"
     r"(memory|vram)\b(?!\s*(traffic|bandwidth|reads|access|transfer))",
     r"(节省|节约|减少|降低|省)[^。；;，,]{0,3}(显存|内存)(?!带宽)"],
    ["memory_cost"],
    "the KV cache does not save memory: think about what it spends to save work",
    "KV Cache 并不节省显存：想一想它用什么换来了更少的计算")
STORES_WEIGHTS = misconception(
    "stores_weights",
    [r"(cach|stor|keep|sav)\w*\s+(\w+\s+){0,3}?(model\s+)?(weights|parameters)\b",
     r"(缓存|保存|存储|存)[^。；;]{0,4}(模型)?(权重|参数)"],
    ["no_recompute"],
    "the KV cache does not hold the model's weights: think about what is computed per token",
    "KV Cache 存的不是模型权重：想一想每个 token 会算出什么")
RANDOM_ONLY = misconception(
    "random_only",
    [r"\b(only|just|merely|simply|purely|mainly|mostly)\s+(\w+\s+){0,5}?(random\w*|creativ\w*|divers\w*|variet\w*|"
     r"style|cosmetic|\bui\b|flavou?r|spice|decorat\w*|look\w*)",
     r"\b(ui|cosmetic|front-?end|presentation|display|product[- ]layer)\s+(knob|setting|parameter|option|feature|"
     r"layer|detail|concern|tweak|choice)", r"\bpost-?process\w*",
     r"(?<!不)只是[^。；;]{0,8}(随机|多样|创意|风格|花样|UI|界面)", r"(?<!不)只是\s*(拿去|用来|用于|拿来|给人)\s*(显示|展示|看)", r"(?<!不)仅仅[^。；;]{0,8}(随机|多样|UI)",
     r"(UI|界面|前端|产品层)[^。；;]{0,4}(参数|旋钮|选项|设置|细节)", r"后处理", r"只是显示",
     r"\b(only|just|merely)\s+(affects?|changes?|matters?\s+for)\s+(\w+\s+){0,2}?(what\s+(is|gets)\s+)?(shown|displayed|printed|display)\b", r"(?<!不)(只|仅|仅仅)(影响|改变|用于|决定)[^。；;，,]{0,4}(展示|显示|界面|UI|风格|外观|观感)", r"only shown"],
    ["token_to_history", "next_step_depends", "sampling_picks"],
    "sampling is not only about how random the text looks: think about where the picked token goes",
    "采样不只是让文字更随机：想一想选出的 token 去了哪里")
NO_EFFECT_LATER = misconception(
    "no_effect_later",
    [r"\b(doesn't|does not|don't|do not|never|won't|will not|cannot|can't)\s+(\w+\s+){0,2}?(affect|change|influence|alter|"
     r"matter)\w*\s+(\w+\s+){0,4}?(later|next|following|subsequent|history|context|future|computation|what the engine)",
     r"(不|并不|不会)影响[^。；;]{0,8}(后续|下一|历史|上下文|计算|之后)",
     # the next step computed from something else: "the next step is computed from the prompt only"
     r"\b(next|later|following)\s+(\w+\s+){0,2}?(steps?|tokens?|passes?)\s+(is|are)\s+(\w+\s+)?(computed|calculated|predicted|generated|based)\s+"
     r"(only\s+)?(from|on)\s+(the\s+)?(original\s+)?(prompt|input)\s+(only|alone)\b",
     r"(下一步|之后|后面|后续)[^。；;，,]{0,10}只(看|根据|基于|用|依赖)[^，。；,;]{0,3}((原来|原始|最初|一开始)的?\s*)?(prompt|提示|原始输入|原来的输入)"],
    ["next_step_depends"],
    "the sampled token does matter for later steps: think about what they are computed from",
    "采样出的 token 会影响后续步骤：想一想它们是基于什么计算的")

HOLDS_RESOURCES = idea(
    "holds_resources", "each request holds state and resources until it is released", "每个请求从进入到释放都占着状态和资源",
    polar=False,  # "没释放的块", "blocks not yet freed": still held
    standalone=[r"\bblocks?\b", r"\bslots?\b", r"\buntil\s+(it|the request|they)\s+(ends|finishes|is released|is freed|are released)\b",
                r"\b(holds?|holding|occup\w*|owns?|keeps?|has|have)\b\s+(\w+\s+){0,3}?(resources?|state|kv|blocks?|slots?|memory|"
                r"tokens)", r"\b(resources?|state|states)\b", r"\bkv blocks?\b", r"\bstate machines?\b",
                r"资源", r"状态", r"占用", r"占着", r"持有", r"KV ?块", r"(?<!一)块", r"槽位",
                r"(没|未|不)(有)?(释放|归还|回收)", r"\bnot\s+(yet\s+)?(freed|released|returned)\b"])
MIXED_STATES = idea(
    "mixed_states", "a batch mixes requests in different, changing states", "一个批次里的请求处于不同且不断变化的状态",
    standalone=[r"\bdifferent\s+(\w+\s+){0,1}?(states?|phases?|stages?)", r"\bstates?\s+(transitions?|changes?|change|keep changing)",
                r"\bwho\s+\w+s?\b[^.;]{0,30}\bwho\s+\w+", r"\bothers?\s+(are\s+)?(decod|prefill|wait)\w*",
                r"\b(join|leave|enter|exit|finish)\w*\b[^.;]{0,40}\b(batch|step)", r"\b(mix|mixes|mixed|mixing)\b",
                r"\bchang\w*\s+(\w+\s+){0,2}?(every|each)\s+step", r"\b(transition|move)\w*\b",
                r"不同(的)?(状态|阶段|进度)", r"(进度|阶段|步调)[^，。；]{0,4}(不一样|不同|各异|不相同|各不)", r"状态(转移|转换|变化|切换)", r"状态[^，。；]{0,6}(变化|改变|在变|会变|不一样|不同|各异|不相同|各不)",
                r"各(不|有)(相同|一样)的?(状态|阶段)", r"每一?步[^，。；]{0,10}状态",
                r"(改|更新|推进|切换|变)[^，。；]{0,6}(state|状态)", r"有的[^。；]{0,16}有的", r"有的(在|处于|正在)",
                # "有人刚进来在 prefill、有人在 decode 第 300 步": some … others, said of where they are
                r"有人\s*(刚|在|正在|已经|已|还在|还|处于)[^。；]{0,24}有人\s*(刚|在|正在|已经|已|还在|还|处于)",
                r"有(的)?(请求|序列|request)\s*(刚|在|正在|已经|已|还在|还|处于)?\s*[\u4e00-\u9fff]{1,3}[^。；]{0,12}有(的)?(请求|序列|request)",
                r"\bwho('s|\s+is)\s+(at|in)\s+which\s+(stage|state|phase|step)\b", r"谁(在|处于)哪(个|一)?(阶段|状态|步)",
                r"状态[^，。；]{0,4}(一直|不断|每一?步|总)[^，。；]{0,4}(变|改)",
                r"\bsome\b[^.;]{0,40}\b(others?|some)\b", r"\bchanging\s+(\w+\s+)?states?\b", r"一些[^。；]{0,16}一些",
                r"\b(join|leave|enter|finish)\w*\b[^.;]{0,30}\bdifferent\s+(times?|moments?|points?)\b",
                r"\bbatch\w*\s+(\w+\s+){0,2}?(keeps?\s+)?chang\w*",
                r"(加入|离开|进出|进进出出)", r"混合", r"既有[^。；]{0,24}(也有|又有|还有)", r"(每一?步|随时)[^，。；]{0,16}(变|改变|不同)", r"谁(在|该|要)?[^。；]{0,10}谁(在|该|要)",
                # who runs is decided again at every step: the batch changes
                r"每一?(步|轮|次)[^，。；]{0,8}(重新)?(决定|选择|安排|挑选?)[^，。；]{0,4}(谁|哪些|哪个)",
                r"\b(every|each)\s+step\b[^.;]{0,40}\b(decid\w*|choos\w*|pick\w*|select\w*)\s+(again\s+)?(who|which)\b"])

EARLY_TURN_MATTERS = idea(
    "early_turn", "the early turn the chat keeps needing would be dropped by a last-N window",
    "只保留最近 N 轮会丢掉后面一直需要的早期内容", polar=False,
    standalone=[r"\b(turn|message|round)[\s-]*(1|one)\b", r"\bfirst\s+(turn|message|round)", r"\b(early|earlier|old|older|"
                r"original|initial)\s+(\w+\s+){0,2}?(turns?|messages?|context|exercise|problem|information|details?|"
                r"content)", r"\b(exercise|problem statement|the task)\b[^.;]{0,60}\b(lost|dropp\w*|forg\w*|cut|gone|"
                r"kept|keep\w*|preserv\w*|remain\w*|retain\w*)", r"\b(lose|loses|lost|drop\w*|forget\w*|cut\w*\s+((it|them|that|this|those)\s+)?off)\b",
                r"第一轮", r"第 ?1 ?轮", r"最早", r"开头", r"早期", r"最前(面|头|边)", r"一开始", r"最初", r"之前的(题目|内容|信息)",
                # the very start of the chat, named as a time the exercise was given ("在最开始就贴了", "from the very start")
                r"(在|从)最开始|最开始(的|就|贴|给|发|那|提)", r"\bfrom\s+the\s+(very\s+)?(start|beginning)\b",
                r"\b(at|in)\s+the\s+(very\s+)?(start|beginning)\s+of\s+the\s+(chat|conversation|dialog\w*|session)\b",
                r"(丢|丢失|丢掉|忘|遗忘|截掉|保留|(留|保|记)不?住|留下|扔|挤掉|挤出|裁掉|删掉|去掉|找不到|看不到)",
                r"\b(throw\w*|threw|thrown)\s+(\w+\s+)?(away|out)\b", r"\bdiscard\w*", r"\bget\s+rid\s+of\b",
                # the exercise carried along, the object first in a 把 phrase: "把题目压缩进摘要里一直带着"
                r"把\s*(第一轮|第 ?1 ?轮|最早的?|开头的?|题目)[^，。；,;]{0,12}?(带着|带上|留着|记着|存着|放进|压缩进|写进|装进)"])
BOUNDED_KV = idea(
    "bounded_kv", "the KV each turn holds stays bounded", "每轮占用的 KV 保持有界",
    standalone=[r"\b(bound\w*|budget|cap\w*|limit\w*|fixed|constant|stays? (small|flat)|fits?)\b", r"预算|上限|有界|固定|不再增长|受控"])
DECODE_PER_TOKEN = idea(
    "decode_per_token", "decode takes one step per output token, so output length and scheduling set latency and use",
    "decode 每个输出 token 一步，所以输出长度和调度决定总延迟和设备利用率",
    standalone=[r"\b(each|every|one|a)\s+(output\s+|generated\s+|new\s+)?token\s+(\w+\s+){0,3}?(step|round|pass|iteration)s?\b",
                r"\b(output\s+length|length of the output)\b[^.;]{0,50}\b(latency|steps?|time|utili[sz]\w*)",
                r"(一|每)(个|一个)?(输出|生成的?)?\s*token\s*[^，。；,;]{0,4}(一|1)\s*(步|轮)",
                r"\b(one|a|each|every)\s+(\w+\s+){0,2}?(step|round|pass|iteration|forward)s?\s+(\w+\s+){0,2}?"
                r"(per|for each|for every|for one)\s+(\w+\s+){0,1}?tokens?", r"\bper\s+(output\s+|generated\s+)?token\b",
                r"\b(token by token|round by round|step by step|one token at a time)\b",
                r"\b(long|longer|more)\s+(\w+\s+){0,2}?(outputs?|tokens)\b[^.;]{0,50}\b(steps?|rounds?|latency|longer|time)",
                r"\bschedul\w*\b[^.;]{0,50}\b(batch\w*|together|utili[sz]\w*|throughput|busy|idle)",
                r"每(个|一个)?(输出|生成的?)?\s*token\s*(一|1)\s*(步|轮)",
                r"每(个|一个)?(输出|生成的?)?\s*token\s*[^，。；,;]{0,6}(一|1)\s*(步|轮|次|遍)",
                r"(取决于|决定于|看|跟)[^，。；,;]{0,6}(生成|输出)[^，。；,;]{0,4}(多少|多长|长度|数量)",
                r"\bdepends?\s+on\s+how\s+(many|long)\b", r"(一|每)\s*(步|轮)[^，。；,;]{0,6}(一|1)\s*个?\s*token",
                r"步数\s*(=|等于|就是|和|跟)\s*(输出|生成)", r"逐(个|一)?\s*token|一轮一轮|一步一步",
                r"输出(越|很)?长[^。；;]{0,20}(步|轮|延迟|越久|时间|慢)", r"步数[^，。；,;]{0,3}(越多|更多|增加|变多)",
                r"\bmore\s+(decode\s+)?steps\b", r"(调度|批|batch)[^。；;]{0,16}(利用率|吞吐|一起|合批|空闲)"])

# --- denials of the key ideas: said plainly, they are the misconception, not the idea -----------------------------
# what decode would read, named as an object ("它", "这份缓存", "prefill 存好的 KV"); a cache of answers is pitfall 1's
_CACHE_OBJ_ZH = (r"\s*(这份|那份|这个|那个|这些|之前的?|前面的?|已有的?|存好的?|现成的?|prefill\s*(阶段)?\s*(存|算|写|建|留|填)?"
                 r"(好|下|出)?的?)?\s*(KV\s*(cache|缓存)?|缓存|cache|它们?)(?!\s*(里|中)?\s*的?\s*(答案|回答|回复))")
_NEG_ZH = r"(不|没有?|并不|从不|根本不|从来不|压根不|不会|并没有?)\s*(再|去|会)?\s*"
CACHE_UNREAD = misconception(
    "cache_unread",
    [_NEG_ZH + r"(读取?|查|看|碰|访问|复用|利用|理会|管|拿)(到|过|了|上)?" + _CACHE_OBJ_ZH,
     # 不用 + the cache then a verb of computing is "needn't … recompute" ("不用 KV 重新算"): not this
     _NEG_ZH + r"(使用|用)(到|过|了|上)?" + _CACHE_OBJ_ZH + r"(?!\s*(重新|重复|再|从头)?\s*(算|计算|生成|推理))",
     r"(读|用|查|拿)不(到|着|上)" + _CACHE_OBJ_ZH, r"(跳过|绕过|无视|忽略|抛开|不理)" + _CACHE_OBJ_ZH,
     r"自己\s*(重新|从头|再)\s*(算|计算)|自己\s*重算|自己[^，。；,;]{0,4}(重新|从头)(算|计算)",
     # decode as the subject of recomputing; a verb of sparing between them is the idea ("decode 跳过重算", "spares decode from")
     _DECODE_ZH + r"((?!跳过|省|免|避|少|不|没|无)[^，。；,;]){0,10}(?P<v>(重新|从头|再次)\s*(算|计算|过一遍|跑一遍)|重算|"
                  r"(从零|从头|重新)\s*开始|另起炉灶)",
     # decode cut off from prefill: "跟 prefill 没关系", "不依赖它", "prefill 和 decode 互不相干"
     r"(跟|和|与)\s*(prefill|预填充?|它|缓存|KV)\s*(没有?|无|毫无)\s*(关系|关联|联系)|(跟|和|与)\s*(prefill|预填充?|它)\s*无关",
     _NEG_ZH + r"(依赖|依靠|基于|需要|靠)" + _CACHE_OBJ_ZH.replace(r"它们?)", r"它们?|prefill)"),
     r"(prefill|预填充?)\s*(和|与|跟)\s*(decode|解码)[^，。；,;]{0,6}(?P<v>互不相干|互不相关|没有?关系|无关|(相互|互相|彼此|各自)独立)",
     r"\b(does\s+not|doesn't|do\s+not|don't|did\s+not|didn't|never|won't|will\s+not|cannot|can't)\s+(actually\s+|even\s+|really\s+)?"
     r"(read|use|touch|look\s+(at|up|in)(to)?|consult|check|access|reuse|query)\w*\s+(\w+\s+){0,2}?(kv\s+)?(cache|it|them|what\s+prefill|prefill's)\b"
     r"(?!\s+of\s+(answers|responses|replies|outputs|completions|prompts))",
     r"\b(ignor|bypass|disregard)\w*\s+(\w+\s+){0,2}?(kv\s+)?(cache|what\s+prefill)\b", r"\bskip\w*\s+(the\s+)?(kv\s+)?cache\b",
     r"\b(recomput|recalculat|redo|redoes|re-comput|re-calculat)\w*\s+(\w+\s+){0,4}?(itself|by\s+itself|on\s+its\s+own)\b",
     r"\bdecod\w*\s+((?!(skip|spar|avoid|sav|bypass|no|never|not|without|from|instead|rather)\w*\b)\w+\s+){0,3}?"
     r"(?P<v>(recomput|recalculat|redo|redoes|re-?run|reprocess|re-comput)\w*|start\w*\s+(over|afresh|from\s+(scratch|zero|the\s+beginning)))",
     r"\b(does\s+not|doesn't|do\s+not|don't|never|won't|will\s+not)\s+(\w+\s+)?(depend\w*\s+on|rel(y|ies)\s+on|build\w*\s+on)\s+"
     r"(\w+\s+){0,2}?(kv\s+)?(cache|it|them|prefill|what\s+prefill)\b",
     r"\b(does\s+not|doesn't|do\s+not|don't|never|won't|will\s+not)\s+need\s+(the\s+)?(kv\s+)?(cache|it|them|prefill)\b",
     r"\b(prefill\s+and\s+decode|decode\s+and\s+prefill|the\s+two(\s+phases)?)\s+(are|run)\s+(\w+\s+)?(?P<v>independent|unrelated)\b",
     r"\bdecod\w*\s+(\w+\s+){0,3}?(?P<v>independent|unrelated|has\s+nothing\s+to\s+do)\s+(of|from|to|with)\s+(\w+\s+)?(prefill|it|the\s+cache)\b"],
    ["no_recompute", "prefill_builds", "decode_continues"],
    "the cache is not left unread: think about what decode does with what prefill wrote",
    "缓存不是放着不用的：想一想 decode 拿 prefill 写下的东西做什么",
    hypothetical_ok=True,  # "如果 decode 不读缓存，就得重算", "without it decode would recompute": the chapter's own point
    # prefill does not read the cache (it writes it); a naive decoder, or one without a cache, does recompute
    true_of=r"(prefill|预填充?|context\s*(phase|阶段))(?![^，。；,;]*(decode|解码|generation))(?=[^，。；,;]*$)|\bnaive\b|\bvanilla\b|朴素|"
            r"\bwithout\s+(a\s+|the\s+|any\s+)?(kv\s+)?cach\w*|\bno[- ](kv[- ])?cache\b|(没|无)有?\s*(KV\s*)?(缓存|cache)")
TOKEN_DROPPED = misconception(
    "token_dropped",
    [r"\b(tokens?|it|choices?|samples?|results?)\s+(is|are|was|gets?)?\s*(not|never|n't)\s+(\w+\s+)?"
     r"(appended|added|fed|written|put|inserted|concatenated)\b",
     r"\b(tokens?|it|choices?|samples?)\s+(doesn't|does\s+not|never|won't|will\s+not|don't|do\s+not)\s+(\w+\s+)?"
     r"(join|enter|go\s+(back\s+)?in(to)?|get\s+(appended|added|fed)|become\s+part)\w*",
     r"\b(doesn't|does\s+not|never|won't|will\s+not|don't|do\s+not)\s+(\w+\s+)?(feed|append|add|put|pass|write|send)\w*\s+"
     r"(it|them|the\s+(\w+\s+)?tokens?)\s+(back|in|into|to)\b",
     r"\b(next|later|following)\s+(\w+\s+){0,2}?(steps?|tokens?|passes?)\s+(\w+\s+){0,2}?(recomput|recalculat|start)\w*\s+"
     r"(\w+\s+){0,2}?from\s+(the\s+)?(original\s+)?(prompt|scratch)\b",
     r"(token|它|结果|这个词|这个字)[^，。；,;]{0,6}(不|没有?|不会|并不|从不)\s*(会)?\s*(被)?\s*(加入|进入|进|追加|拼|放|写|喂|送|回|加|存)"
     r"(到|进|入|回)?[^，。；,;]{0,4}(历史|上下文|输入|序列|模型|KV|缓存|context)",
     r"(不|没有?|不会|并不|从不)\s*(会)?\s*把\s*(它|token|这个\s*token|采样[^，。；,;]{0,4})[^，。；,;]{0,4}(加入|放回|喂回|追加|拼|送回|加到|放进)",
     r"(下一步|之后|后面|后续)[^，。；,;]{0,10}(从|根据|基于)\s*(prompt|提示词?|原始输入|原来的输入)\s*(重新|从头)(算|计算|生成)",
     # thrown away after it is shown ("is not discarded" negates at the verb, group v)
     r"\b(tokens?|it|choices?|samples?)\s+(is|are|gets?|was)\s+(\w+\s+){0,3}?(?P<v>discarded|thrown\s+away|dropped|forgotten)\b",
     r"(token|它)[^，。；,;]{0,6}(?P<v>(就|会)?(被)?(丢掉|丢弃|扔掉|扔了|丢了))",
     # "… is shown and then discarded": the clause after "and then" keeps the token as its subject
     r"^\s*(it\s+is\s+|it's\s+|gets?\s+|is\s+)?(?P<v>discarded|thrown\s+away|dropped|forgotten)\b(?!\s+(when|after|once|at\s+the\s+end))"],
    ["token_to_history", "next_step_depends"],
    "the sampled token is not thrown away: think about where it goes and what reads it next",
    "采样出的 token 不会被丢掉：想一想它去了哪里、接下来谁读它")
NO_HOLD = misconception(
    "no_hold",
    [r"(不|没有?|并不|从不|不会|并没有?)\s*(会)?\s*(占|占用|占着|持有|拿着|霸着|霸占)(有)?[^，。；,;]{0,4}(资源|块|显存|内存|KV|状态|东西)",
     r"\b(hold|holds|own|owns|occupy|occupies|keep|keeps|have|has)\s+no\s+(\w+\s+)?(resources?|blocks?|memory|state|kv)\b",
     r"\b(doesn't|does\s+not|don't|do\s+not|never)\s+(hold|own|occupy|keep|take\s+up|use)\w*\s+(any\s+)?(\w+\s+)?"
     r"(resources?|blocks?|memory|state|kv)\b"],
    ["holds_resources"],
    "a live request is not weightless: think about what it keeps until it is released",
    "活跃请求并不是不占东西的：想一想它在释放之前一直留着什么",
    # a request that has finished or been released does hold nothing: that is the point, not the misconception
    true_of=r"释放|结束|完成|取消|退出|归还|回收|\b(released|freed|finished|done|ended|cancel+ed|completed?|after|once)\b")
