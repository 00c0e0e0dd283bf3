"""Seeded generator of simple synthetic Chinese children's stories (the Chinese half of the corpus).

The bilingual default model learns Chinese from these stories, next to the English ones of
``story_corpus.py``. Like the English grammar, each story draws a hero (a child with a 小名
such as 小明, a named animal such as 一只名叫豆豆的小狐狸, or an unnamed animal or creature),
a friend, a place, an object, a food, the weather and a relative at the start and carries
them through one of several plot shapes (lost and found, making a friend, a trip, a problem
solved, a surprise gift, a fear overcome, a contest, helping someone, a rainy day), so a
prompt such as "从前有一只小狐狸，它" continues into a story about that fox.

It is a module of its own rather than a part of ``story_corpus.py`` because the two grammars
share nothing below the story level: Chinese needs measure words (一只、一头、一条), 他/她/它
instead of articles and capitals, no spaces, and full-width punctuation (，。！？“”：、).

Everything is driven by one ``random.Random(seed)``, so ``generate_stories_zh(n, seed)`` is
deterministic. ``lexicon()`` lists the words of the grammar; the bilingual tokenizer uses it
to cut Chinese text at word boundaries (see ``scripts/train_default_model.py``).

    >>> from story_corpus_zh import generate_stories_zh
    >>> stories = generate_stories_zh(3, seed=0)
"""

from __future__ import annotations

import random
import re

__all__ = [
    "generate_stories_zh",
    "generate_story_zh",
    "lexicon",
    "GIRL_NAMES",
    "BOY_NAMES",
    "PET_NAMES",
    "ANIMALS",
    "CREATURES",
    "PLACES",
    "OBJECTS",
    "FEELINGS",
    "COLOURS",
    "FOODS",
    "WEATHER",
    "PLOTS",
    "PUNCTUATION",
    "MIN_CHARS",
    "MAX_CHARS",
]

MIN_CHARS = 60
MAX_CHARS = 260

#: the only characters besides Han ideographs that a story may contain
PUNCTUATION = "，。！？“”：、"

# ---------------------------------------------------------------------------------------
# Vocabulary of the grammar
# ---------------------------------------------------------------------------------------

GIRL_NAMES = [
    "小红", "小丽", "小芳", "小美", "小雨", "小雪", "小兰", "小花", "朵朵", "甜甜",
    "萌萌", "妞妞", "婷婷", "佳佳", "丽丽", "圆圆", "笑笑", "月月", "小燕", "小玲",
]
BOY_NAMES = [
    "小明", "小刚", "小军", "小华", "小虎", "小宝", "小杰", "乐乐", "丁丁", "冬冬",
    "明明", "亮亮", "天天", "阳阳", "浩浩", "壮壮", "小飞", "小强", "东东", "小林",
]
# names of animals and creatures (a named animal is still 它)
PET_NAMES = [
    "豆豆", "球球", "毛毛", "点点", "咪咪", "花花", "跳跳", "胖胖", "闪闪", "皮皮",
    "嘟嘟", "果果", "糖糖", "米米", "贝贝", "奇奇", "蹦蹦", "灰灰", "白白", "团团",
    "多多", "叮当", "布丁", "泡泡",
]

# (noun as the story says it, measure word)
ANIMALS = [
    ("小狐狸", "只"), ("小兔子", "只"), ("小熊", "只"), ("小猫", "只"), ("小狗", "只"),
    ("小老鼠", "只"), ("猫头鹰", "只"), ("小鸭子", "只"), ("小青蛙", "只"), ("小乌龟", "只"),
    ("小松鼠", "只"), ("小鹿", "只"), ("小狮子", "只"), ("小老虎", "只"), ("小象", "头"),
    ("小猴子", "只"), ("小猪", "头"), ("小牛", "头"), ("小马", "匹"), ("小绵羊", "只"),
    ("小山羊", "只"), ("小母鸡", "只"), ("小企鹅", "只"), ("小鲸鱼", "条"), ("小鱼", "条"),
    ("小鸟", "只"), ("小刺猬", "只"), ("小獾", "只"), ("小狼", "只"), ("长颈鹿", "只"),
    ("小斑马", "匹"), ("熊猫", "只"), ("考拉", "只"), ("小水獭", "只"), ("小浣熊", "只"),
    ("小蜜蜂", "只"), ("小瓢虫", "只"), ("小蜗牛", "只"), ("小螃蟹", "只"), ("小鹦鹉", "只"),
    ("小羊羔", "只"), ("小马驹", "匹"), ("小袋鼠", "只"), ("小海豚", "条"), ("小蝴蝶", "只"),
]
# creatures that are not animals but can be heroes too
CREATURES = [
    ("机器人", "个"), ("小飞龙", "条"), ("小恐龙", "只"), ("独角兽", "只"), ("小仙女", "个"),
    ("小精灵", "个"), ("雪人", "个"), ("小火车", "列"),
]

HERO_ADJECTIVES = [
    "可爱的", "勇敢的", "害羞的", "聪明的", "好奇的", "快乐的", "善良的", "调皮的",
    "爱睡觉的", "热心的", "活泼的", "胆小的", "友好的", "忙碌的", "温柔的", "开朗的",
]
FRIEND_ADJECTIVES = ["友好的", "害羞的", "胖乎乎的", "年老的", "有趣的", "善良的", "聪明的", "小小的"]

# (place, "in the place", [details], [activities, said after the subject])
PLACES = [
    ("公园", "公园里", ["草地又绿又软。", "公园里有高高的大树，还有一个大滑梯。"],
     ["荡了一会儿秋千", "在草地上跑来跑去"]),
    ("海边", "海边", ["沙子暖暖的，海浪很大。", "小螃蟹在沙滩上爬来爬去。"],
     ["堆了一座沙堡", "跳过了一朵朵浪花"]),
    ("森林", "森林里", ["森林里的树又高又老。", "小鸟在高高的树枝上唱歌。"],
     ["摘了一些野果", "听小鸟唱歌"]),
    ("花园", "花园里", ["到处都是玫瑰和郁金香。", "蜜蜂在花丛中嗡嗡地飞。"],
     ["给花浇了水", "在软软的泥土里挖了个洞"]),
    ("农场", "农场上", ["那里有奶牛、小猪和母鸡。", "红色的谷仓又高又大。"],
     ["喂了母鸡", "坐了一会儿拖拉机"]),
    ("湖边", "湖边", ["湖水又平静又蓝。", "几只鸭子在岸边游来游去。"],
     ["在水面上打水漂", "给鸭子喂了面包"]),
    ("小河边", "小河边", ["河水哗哗地流过石头。", "小鱼从水里跳了出来。"],
     ["放了一只纸船", "找了一会儿青蛙"]),
    ("山坡", "山坡上", ["站在山坡顶上，能看见整个小镇。", "山坡上的风很大。"],
     ["从草坡上滚了下来", "躺在草地上看云"]),
    ("草地", "草地上", ["草地上开满了黄色的小花。", "蝴蝶在空中飞来飞去。"],
     ["摘了一把野花", "追着蝴蝶跑"]),
    ("动物园", "动物园里", ["那里有狮子、猴子，还有一只高高的长颈鹿。", "大象在水里玩水。"],
     ["看猴子爬树", "给山羊喂了草"]),
    ("学校", "学校里", ["教室的墙上贴着漂亮的图画。", "老师笑着向大家问好。"],
     ["画了一幅画", "唱了几首歌"]),
    ("图书馆", "图书馆里", ["每个书架上都摆满了书。", "图书馆里静悄悄的。"],
     ["读了一本讲恐龙的书", "看了几本图画书"]),
    ("集市", "集市上", ["人们在卖水果和面包。", "集市上又热闹又吵。"],
     ["买了几个苹果", "把每个摊位都看了一遍"]),
    ("村子", "村子里", ["房子都有红红的屋顶。", "村子中间有一口老井。"],
     ["去看了面包师", "跟邻居们打了招呼"]),
    ("小镇", "小镇上", ["街上到处都是人。", "钟楼上有一座大钟。"],
     ["看了看商店的橱窗", "在广场上吃了冰淇淋"]),
    ("大山", "山上", ["山上的空气又冷又新鲜。", "山顶上还有白白的雪。"],
     ["沿着小路往上爬", "看山下的白云"]),
    ("山洞", "山洞里", ["洞里又黑又凉。", "水从石头上滴下来。"],
     ["用灯照了照洞壁", "听自己的回声"]),
    ("游乐场", "游乐场上", ["那里有滑梯、沙坑和两个秋千。", "到处都是孩子们的笑声。"],
     ["从滑梯上滑了下来", "在沙坑里玩沙子"]),
    ("池塘边", "池塘边", ["绿绿的荷叶浮在水面上。", "一只青蛙蹲在石头上。"],
     ["找了一会儿小蝌蚪", "给鸭子扔了面包"]),
    ("城堡", "城堡里", ["城堡有高高的塔楼和一扇大门。", "城墙上飘着彩旗。"],
     ["在古老的大厅里探险", "爬上了高高的塔楼"]),
    ("面包店", "面包店里", ["店里飘着热面包的香味。", "橱窗里摆着好多蛋糕。"],
     ["吃了一个热乎乎的面包", "看面包师做面包"]),
    ("玩具店", "玩具店里", ["每个架子上都摆满了玩具。", "一列玩具火车在轨道上转圈圈。"],
     ["玩了一会儿玩具火车", "看了看架子上的娃娃"]),
    ("博物馆", "博物馆里", ["那里有一副很老的恐龙骨架。", "墙上挂着许多画。"],
     ["看了恐龙的骨头", "看了一幅画着大海的画"]),
    ("田野", "田野里", ["金黄的麦子长得很高。", "田野中间站着一个稻草人。"],
     ["在麦田里奔跑", "放了一会儿风筝"]),
    ("小岛", "小岛上", ["椰子树在风中摇来摇去。", "小岛四周都是大海。"],
     ["在沙滩上捡贝壳", "在海里游泳"]),
    ("城市", "城市里", ["那里有高楼和热闹的街道。", "汽车和公交车开来开去。"],
     ["坐了公交车", "登上了一座高楼的楼顶"]),
    ("树林", "树林里", ["小路上铺满了落叶。", "松鼠在树上爬上爬下。"],
     ["捡了好多松果", "用树枝搭了一个小棚子"]),
    ("码头", "码头上", ["水面上停着大大的轮船。", "海鸥在船的上空叫着。"],
     ["看了一会儿轮船", "跟一位渔夫聊了聊天"]),
    ("果园", "果园里", ["一排排苹果树整整齐齐。", "空气里有甜甜的香味。"],
     ["摘了红红的苹果", "爬上了一棵苹果树"]),
    ("竹林", "竹林里", ["竹子又高又绿。", "风一吹，竹叶沙沙地响。"],
     ["找到了几根竹笋", "在竹子中间捉迷藏"]),
    ("马戏团", "马戏团里", ["那里有一顶红白条纹的大帐篷。", "小丑跑来跑去，逗得大家哈哈大笑。"],
     ["看了小丑表演", "为杂技演员鼓掌"]),
    ("游泳池", "游泳池里", ["池水又蓝又清。", "孩子们在水里又叫又笑。"],
     ["从这头游到了那头", "扑通一声跳进了水里"]),
    ("菜园", "菜园里", ["菜园里种着白菜和萝卜。", "黄瓜挂在架子上。"],
     ["拔了一个大萝卜", "给菜地浇了水"]),
]

# (noun, measure word)
OBJECTS = [
    ("球", "个"), ("风筝", "只"), ("帽子", "顶"), ("围巾", "条"), ("书", "本"),
    ("布娃娃", "个"), ("玩具熊", "只"), ("玩具船", "只"), ("玩具车", "辆"), ("玩具火车", "列"),
    ("小鼓", "面"), ("哨子", "个"), ("贝壳", "个"), ("石头", "块"), ("钥匙", "把"),
    ("戒指", "枚"), ("盒子", "个"), ("书包", "个"), ("杯子", "个"), ("毯子", "条"),
    ("雨伞", "把"), ("铃铛", "个"), ("蜡笔", "支"), ("铅笔", "支"), ("地图", "张"),
    ("小灯", "盏"), ("羽毛", "根"), ("纽扣", "颗"), ("硬币", "枚"), ("项链", "条"),
    ("水桶", "个"), ("铲子", "把"), ("篮子", "个"), ("气球", "个"), ("拼图", "盒"),
    ("手套", "只"), ("弹珠", "颗"), ("闹钟", "个"), ("旗子", "面"), ("陀螺", "个"),
    ("跳绳", "根"), ("背包", "个"), ("手表", "块"), ("手镯", "只"), ("丝带", "条"),
    ("笛子", "支"), ("画笔", "支"), ("贴纸", "张"), ("发卡", "个"), ("风车", "个"),
    ("毽子", "个"), ("口琴", "个"), ("万花筒", "个"),
]

# (before a noun after a measure word, short form before a noun after 的)
COLOURS = [
    ("红色的", "红"), ("蓝色的", "蓝"), ("绿色的", "绿"), ("黄色的", "黄"), ("粉色的", "粉"),
    ("紫色的", "紫"), ("橙色的", "橙"), ("白色的", "白"), ("黑色的", "黑"), ("棕色的", "棕"),
    ("金色的", "金"), ("银色的", "银"), ("亮晶晶的", "亮晶晶的"), ("带条纹的", "条纹"),
    ("带圆点的", "圆点"),
]

# predicates, each with its own degree word: "小明很开心。"
FEELINGS = [
    "很开心", "很难过", "很害怕", "很兴奋", "很骄傲", "很生气", "很累", "很孤单", "很担心",
    "很惊讶", "很好奇", "很平静", "很勇敢", "有点害羞", "不太高兴", "很紧张", "很高兴", "很伤心",
]
SAD_FEELINGS = ["很难过", "很伤心", "着急极了", "又难过又着急", "难过得快要哭了"]
HAPPY_FEELINGS = ["很开心", "非常高兴", "开心极了", "高兴得跳了起来", "心里美滋滋的"]
SCARED_FEELINGS = ["很害怕", "很紧张", "有点害怕", "心里怦怦直跳"]
LONELY_FEELINGS = ["很孤单", "有点孤单", "又无聊又孤单", "一个人很寂寞"]
BORED_FEELINGS = ["有点无聊", "不太高兴", "很失望", "闷闷不乐"]
EXCITED_FEELINGS = ["兴奋极了", "非常兴奋", "很开心", "好奇极了"]

# (phrase with a number word, short noun to refer back)
FOODS = [
    ("一个苹果", "苹果"), ("一块蛋糕", "蛋糕"), ("几块饼干", "饼干"), ("一个三明治", "三明治"),
    ("一块苹果派", "苹果派"), ("一碗热汤", "汤"), ("面包和蜂蜜", "面包"), ("一块奶酪", "奶酪"),
    ("一根胡萝卜", "胡萝卜"), ("一根香蕉", "香蕉"), ("一些野莓", "野莓"), ("几张煎饼", "煎饼"),
    ("一个松饼", "松饼"), ("一个冰淇淋", "冰淇淋"), ("一串葡萄", "葡萄"), ("一些樱桃", "樱桃"),
    ("一个梨", "梨"), ("一些坚果", "坚果"), ("一碗面条", "面条"), ("几个饺子", "饺子"),
    ("一个包子", "包子"), ("一块月饼", "月饼"), ("一串糖葫芦", "糖葫芦"), ("一个大桃子", "桃子"),
    ("一块西瓜", "西瓜"), ("一些爆米花", "爆米花"),
]

# (word before 的日子, sentence describing it)
WEATHER = [
    ("晴朗", "阳光暖暖地照着大地。"), ("下雨", "天上下着雨。"), ("刮风", "风呼呼地吹着。"),
    ("下雪", "雪花轻轻地飘落。"), ("阴沉沉", "天上飘着灰色的云。"), ("有雾", "到处都是雾。"),
    ("暖和", "空气暖暖的。"), ("寒冷", "天气很冷。"), ("晴空万里", "天空又蓝又干净。"),
]

# (relative, gender)
RELATIVES = [("妈妈", "f"), ("爸爸", "m"), ("奶奶", "f"), ("爷爷", "m"), ("姐姐", "f"),
             ("哥哥", "m"), ("阿姨", "f"), ("叔叔", "m"), ("外婆", "f"), ("外公", "m")]

HOBBIES = ["唱歌", "跳舞", "看书", "画画", "踢球", "爬树", "搭积木", "看星星", "跑步",
           "讲笑话", "做蛋糕", "吹笛子", "游泳", "数数", "放风筝", "折纸", "下棋"]

# where someone lives: "住在…" and "在…，住着…"
HOMES = [
    "海边的一座小房子里", "一棵大树下的树洞里", "一个热闹的农场上", "森林里的一座小木屋里",
    "一座大城市里", "一条安静的小河边", "一座有绿色大门的小屋里", "小村子的最边上",
    "一座高高的山坡上", "一个开满鲜花的花园里",
]

HIDING_SPOTS = ["一丛灌木下面", "一块大石头后面", "长椅旁边", "高高的草丛里", "一堆落叶下面",
                "水边", "一棵树后面", "一张木桌底下", "一个旧箱子里", "一根高高的树枝上"]
SEARCH_SPOTS = ["灌木丛", "石头", "长椅", "大树", "落叶", "草丛", "桌子", "花丛"]
DOINGS = ["坐在树下", "躲在石头后面", "一个人坐着", "在小路边哭", "望着水面发呆", "自己在玩"]

# (vehicle, "by vehicle", "got on the vehicle")
VEHICLES = [("汽车", "坐汽车", "坐上了汽车"), ("火车", "坐火车", "坐上了火车"),
            ("公交车", "坐公交车", "坐上了公交车"), ("船", "坐船", "上了船"),
            ("自行车", "骑自行车", "骑上了自行车"), ("大巴车", "坐大巴车", "坐上了大巴车"),
            ("小船", "坐小船", "上了小船")]
SIGHTS = ["高高的大树", "绿绿的小山", "一条大河", "好多奶牛", "一座座小房子", "一道彩虹",
          "田野里的绵羊", "一座风车", "一座长长的大桥", "天上的小鸟"]

GAMES = ["捉迷藏", "老鹰捉小鸡", "丢手绢", "跳房子", "过家家", "猜谜游戏", "跳绳"]

# (what went wrong, what the hero tried, why it failed, the tool, what the tool did, who was glad)
PROBLEMS = [
    ("{a_obj}挂在了高高的树上", "跳起来去够", "树枝太高了", "一根长竹竿", "把{obj}捅了下来", None),
    ("一只小鸟从鸟窝里掉了下来", "把小鸟放回鸟窝", "鸟窝太高了", "一架梯子", "把小鸟送回了鸟窝", "鸟妈妈"),
    ("花儿都干得蔫了", "等着下雨", "一滴雨也没下", "一桶水", "给每一朵花都浇了水", None),
    ("一块大石头挡在了路中间", "把石头推开", "石头太重了", "一根结实的绳子", "和朋友们一起把石头拉开了", None),
    ("小船上破了一个洞", "就这样划船", "水一下子就漏了进来", "一块胶布", "把洞补好了", None),
    ("一只小猫被困在了屋顶上", "叫小猫下来", "小猫太害怕了", "一架梯子", "把小猫抱了下来", "小猫"),
    ("小溪上的木桥断了", "跳过小溪", "小溪太宽了", "几根长木头", "搭了一座新桥", None),
    ("球滚进了池塘里", "伸手去够", "水太深了", "一个渔网", "把球捞了上来", None),
    ("回家的路黑乎乎的", "找到回家的路", "天太黑了，什么也看不见", "一盏小灯", "照亮了回家的路", None),
    ("旧推车的轮子坏了", "拉动推车", "推车一动也不动", "一个新轮子", "把推车修好了", None),
]

# (what the hero fears, what the hero did when afraid, how the hero faced it)
FEARS = [
    ("黑夜", "躲进被子里", "关掉了灯，透过窗户看天上的星星"),
    ("隔壁的大狗", "转身就跑", "轻轻地摸了摸大狗的头"),
    ("深深的水", "站在岸上不敢动", "先把一只脚伸进水里，然后是另一只"),
    ("打雷", "用双手捂住耳朵", "数着闪电和雷声之间隔了几秒"),
    ("高高的滑梯", "绕着滑梯走开", "爬上梯子，从滑梯上滑了下来"),
    ("黑黑的老山洞", "离山洞远远的", "提着灯走进了山洞"),
    ("大大的海浪", "坐在沙滩上不动", "跳过了一朵小小的浪花"),
    ("爬树", "待在地上不敢上去", "爬上了第一根树枝"),
    ("摇摇晃晃的吊桥", "远远地躲开", "一步一步地走过了吊桥"),
    ("蜜蜂", "跑回屋里", "安静地坐着，看一只蜜蜂在花上采蜜"),
    ("陌生的新教室", "在门口哭个不停", "走进教室，跟大家说了一声“你好”"),
]

# (contest, how the hero practised, what the hero did on the day)
CONTESTS = [
    ("跑步比赛", "每天早上都去跑步", "跑得像风一样快"),
    ("烘焙比赛", "每天都做一个蛋糕", "做了一个大大的巧克力蛋糕"),
    ("画画比赛", "每天都画画", "画了一道美丽的彩虹"),
    ("唱歌比赛", "每天晚上都练习唱歌", "唱了一首好听的歌"),
    ("跳高比赛", "每天都练习跳过木头", "跳得比以前都高"),
    ("风筝比赛", "每天下午都去放风筝", "把风筝放得高高的"),
    ("堆沙堡比赛", "每天都堆沙堡", "堆了一座有四个塔楼的沙堡"),
    ("跳舞比赛", "每天晚上都练习跳舞", "跳了一支快乐的舞"),
    ("游泳比赛", "每天早上都去游泳", "游得像小鱼一样快"),
    ("踢毽子比赛", "每天都练习踢毽子", "一口气踢了一百下"),
]
# (prize, measure word)
PRIZES = [("奖牌", "枚"), ("奖杯", "个"), ("星星徽章", "枚"), ("小皇冠", "顶"), ("奖状", "张"),
          ("绶带", "条")]

# (what the old one was carrying, where it went: "把东西…")
HELP_TASKS = [
    ("一大篮苹果", "送回了家"), ("一大袋面粉", "送到了面包店"), ("一捆木柴", "背回了家"),
    ("一桶水", "提到了菜园"), ("一箱书", "搬到了图书馆"), ("一袋胡萝卜", "运到了集市上"),
    ("一篮鸡蛋", "送回了家"), ("一大锅汤", "送到了朋友家"),
]
# (first mention, later mention)
OLD_ONES = [("一只老熊", "老熊"), ("一只老猫头鹰", "老猫头鹰"), ("一只老乌龟", "老乌龟"),
            ("一只老山羊", "老山羊"), ("一位老奶奶", "老奶奶"), ("一位老爷爷", "老爷爷"),
            ("一只老獾", "老獾"), ("一位老婆婆", "老婆婆")]

GIFTS_MADE = ["一张画着大红心的卡片", "一条贝壳项链", "一个漂亮的花环", "一个小相框",
              "一个小蛋糕", "一个纸风车", "一串彩色的珠子手链", "一个布娃娃"]

PLOTS = ["lost_found", "new_friend", "trip", "problem", "gift", "fear", "contest", "helping", "rainy_day"]

# Words of the templates, for ``lexicon()``: the tokenizer cuts Chinese text at these.
_TEMPLATE_WORDS = """
从前 很久 以前 有一天 一天 早上 晚上 下午 傍晚 中午 午饭 晚饭 今天 明天 第二天 那天 那一天
从那天起 从那以后 以后 时候 终于 最后 忽然 这时 就在这时 后来 然后 于是 可是 但是 不过 虽然
而且 因为 所以 只要 还是 一直 总是 每天 每次 每一次 每个 星期 到处 一起 一遍 一边 一点 一点儿
有点 非常 特别 真的 已经 马上 很快 没过多久 一会儿 好久 很久 慢慢地 轻轻地 紧紧地 认真 大大的
我们 你们 他们 大家 自己 别人 朋友 好朋友 新朋友 名字 名叫 东西 地方 事情 办法 主意 问题 秘密
什么 怎么 怎么办 为什么 哪儿 这里 那里 这个 那个 一个 一只 一头 一条 一匹 一位 一列 一块 一些
喜欢 最喜欢 心爱 知道 觉得 明白 学会 发现 看见 听见 遇见 找到 不见 回家 出门 生日 礼物 惊喜
比赛 练习 帮助 帮忙 谢谢 谢谢你 你好 对不起 没关系 欢呼 鼓掌 放弃 害怕 勇敢 骄傲 开心 高兴
难过 伤心 孤单 寂寞 无聊 兴奋 生气 担心 惊讶 好奇 平静 害羞 紧张 失望 美滋滋 着急 可怕 好玩
有趣 美丽 漂亮 可爱 合适 重要 容易 厉害 深深 高高 小小 暖暖 软软 绿绿 红红 白白 热乎乎 黑乎乎
太阳 月亮 星星 天空 下山 下雨 下雪 刮风 阳光 雪花 草地 大树 树枝 树叶 小路 石头 花儿 鲜花
妈妈 爸爸 奶奶 爷爷 姐姐 哥哥 阿姨 叔叔 外婆 外公 老师 孩子 孩子们 小朋友 小动物 小女孩 小男孩
住在 住着 带着 拿着 提着 走了过来 走过来 看了看 找了找 想了想 试一试 一口气 笑着 哭着 说着
打开 送给 分给 告诉 问好 招呼 旅行 收拾 背包 窗外 路上 回家的路 床底下 身边 身后 心里
游戏 玩具 蛋糕 饼干 面包 牛奶 枕头 毯子 城堡 木偶戏 茶话会 窗户 告示 第二名 晚安 睡觉 睡着
"""


def lexicon() -> list[str]:
    """The multi-character words of the grammar, longest first.

    Chinese has no spaces, so a tokenizer trained on it would happily learn tokens that
    span word boundaries ("它很"), and a prompt that ends between two words would then end
    in a token the model rarely saw there. Cutting Han text at these words first (forward
    maximum matching) keeps token boundaries at word boundaries.
    """
    words = set(_TEMPLATE_WORDS.split())
    words.update(GIRL_NAMES + BOY_NAMES + PET_NAMES + HOBBIES + GAMES + SEARCH_SPOTS)
    for noun, _ in ANIMALS + CREATURES:
        words.add(noun)
        if noun.startswith("小") and len(noun) > 2:
            words.add(noun[1:])  # 狐狸 as well as 小狐狸
    words.update(p[0] for p in PLACES)
    words.update(p[1] for p in PLACES)
    words.update(o[0] for o in OBJECTS)
    words.update(f[1] for f in FOODS)
    words.update(c[0][:-1] for c in COLOURS if c[0].endswith("色的"))
    words.update(r[0] for r in RELATIVES)
    words.update(v[0] for v in VEHICLES)
    words.update(p[0] for p in PRIZES)
    words.update(c[0] for c in CONTESTS)
    words.update(o[1] for o in OLD_ONES)
    return sorted((w for w in words if len(w) >= 2), key=lambda w: (-len(w), w))


# ---------------------------------------------------------------------------------------
# Characters and the story builder
# ---------------------------------------------------------------------------------------

_PRONOUNS = {"f": "她", "m": "他", "n": "它"}


class Character:
    """A child, an animal or a creature in a story, referred to consistently."""

    def __init__(self, rng: random.Random, kind: str, measure: str, gender: str,
                 name: str | None, adj: str):
        self.rng = rng
        self.kind = kind          # 小女孩, 小狐狸, 机器人 ...
        self.measure = measure    # 个, 只, 头 ...
        self.gender = gender      # f / m for children, n (它) for animals and creatures
        self.name = name
        self.adj = adj
        self.introduced = False

    @property
    def human(self) -> bool:
        return self.kind in ("小女孩", "小男孩")

    @property
    def he(self) -> str:
        return _PRONOUNS[self.gender]

    def ref(self) -> str:
        """How the story names this character again (drawn afresh at each mention)."""
        if not self.introduced:
            return self.full()
        if self.name:
            if self.human or self.rng.random() < 0.85:
                return self.name
            return self.kind
        return (self.adj if self.rng.random() < 0.2 else "") + self.kind

    def full(self) -> str:
        """First mention: 一只名叫豆豆的小狐狸, 一只害羞的小熊; later just the short name."""
        if self.introduced:
            return self.ref()
        self.introduced = True
        if self.name:
            return f"一{self.measure}名叫{self.name}的{self.kind}"
        return self.kindfull()

    def kindfull(self) -> str:
        """一只小狐狸 / 一只勇敢的小狐狸 (no name)."""
        self.introduced = True
        adj = self.adj if self.rng.random() < 0.5 else ""
        return f"一{self.measure}{adj}{self.kind}"

    def hand(self) -> str:
        return "手" if self.human or self.kind in ("机器人", "小仙女", "小精灵", "雪人") else "爪子"


class _Ctx(dict):
    """format_map mapping whose values may be re-drawn at each use (callables)."""

    def __getitem__(self, key: str) -> str:
        value = dict.__getitem__(self, key)
        return value() if callable(value) else value


class _Story:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.sentences: list[str] = []
        self.hero = self._character(hero=True)
        self.friend = self._character(hero=False, avoid=self.hero)
        self.place = rng.choice(PLACES)
        self.obj = rng.choice(OBJECTS)
        self.colour = rng.choice(COLOURS)
        self.food = rng.choice(FOODS)
        self.weather = rng.choice(WEATHER)
        self.relative = rng.choice(RELATIVES)
        self.vehicle = rng.choice(VEHICLES)
        self.at_place = False  # the opening already took the hero to the place
        h, f = self.hero, self.friend
        sights = rng.sample(SIGHTS, 2)
        searches = rng.sample(SEARCH_SPOTS, 2)
        self.ctx = _Ctx(
            hero=h.ref, he=h.he, his=h.he + "的", hfull=h.full, hkindfull=h.kindfull,
            hkind=h.kind, hadj=h.adj, hname=h.name or "",
            fr=f.ref, fhe=f.he, ffull=f.full, fkind=f.kind, fname=f.name or "",
            fmeasure=f.measure, fhand=f.hand(),
            place=self.place[0], inplace=self.place[1],
            obj=self.obj[0], theobj="那" + self.obj[1] + self.obj[0],
            a_obj="一" + self.obj[1] + self.colour[0] + self.obj[0],
            cobj=self.colour[1] + self.obj[0], colour=self.colour[0],
            food=self.food[0], foodn=self.food[1],
            wday=self.weather[0], wsent=self.weather[1],
            rel=self.relative[0],
            vehicle=self.vehicle[0], by=self.vehicle[1], board=self.vehicle[2],
            sight=sights[0], sight2=sights[1],
            sad=lambda: rng.choice(SAD_FEELINGS), happy=lambda: rng.choice(HAPPY_FEELINGS),
            scared=lambda: rng.choice(SCARED_FEELINGS), lonely=lambda: rng.choice(LONELY_FEELINGS),
            bored=lambda: rng.choice(BORED_FEELINGS), excited=lambda: rng.choice(EXCITED_FEELINGS),
            feeling=lambda: rng.choice(FEELINGS),
            hobby=lambda: rng.choice(HOBBIES), home=rng.choice(HOMES),
            game=lambda: rng.choice(GAMES), doing=lambda: rng.choice(DOINGS),
            spot=rng.choice(HIDING_SPOTS),
            search1=searches[0], search2=searches[1],
            hisfriend=lambda: h.he + "的朋友" + f.ref() if f.introduced else f.full(),
            gift=rng.choice(GIFTS_MADE), colour2=rng.choice(COLOURS[:12])[0],
        )

    # -- characters --------------------------------------------------------------------
    def _character(self, hero: bool, avoid: Character | None = None) -> Character:
        rng = self.rng
        used = {avoid.name, avoid.kind} if avoid else set()
        adjs = HERO_ADJECTIVES if hero else FRIEND_ADJECTIVES
        while True:
            r = rng.random()
            if r < 0.42:  # a child, called by a 小名
                gender = rng.choice("fm")
                kind, measure = ("小女孩" if gender == "f" else "小男孩"), "个"
                name = rng.choice(GIRL_NAMES if gender == "f" else BOY_NAMES)
            elif r < (0.80 if hero else 0.88):  # a named animal or creature
                gender = "n"
                kind, measure = rng.choice(ANIMALS) if rng.random() < 0.85 else rng.choice(CREATURES)
                name = rng.choice(PET_NAMES)
            else:  # an unnamed animal or creature
                gender = "n"
                kind, measure = rng.choice(CREATURES) if rng.random() < 0.3 else rng.choice(ANIMALS)
                name = None
            if name not in used and kind not in used:
                break
        return Character(rng, kind, measure, gender, name, rng.choice(adjs))

    # -- writing -----------------------------------------------------------------------
    def say(self, *options: str) -> None:
        """Add one sentence (or a few), picking one of *options*."""
        self.sentences.append(self.rng.choice(options).format_map(self.ctx))

    def maybe(self, p: float, *options: str) -> None:
        if self.rng.random() < p:
            self.say(*options)

    def text(self) -> str:
        return "".join(self.sentences)

    def place_detail(self, n: int = 1) -> None:
        details = self.place[2][:]
        self.rng.shuffle(details)
        self.sentences.extend(details[:n])

    def place_activity(self) -> str:
        return self.rng.choice(self.place[3])

    def meet_friend(self) -> None:
        """Introduce the friend by a sentence of its own if the story has not named it yet."""
        if not self.friend.introduced:
            self.say("{hero}有一个好朋友，是{ffull}。", "{hero}最好的朋友是{ffull}。")

    # -- openings ----------------------------------------------------------------------
    def opening(self) -> None:
        rng, h = self.rng, self.hero
        named = h.name is not None
        choice = rng.random()
        if choice < 0.40:  # 从前……
            if named and rng.random() < 0.5:
                self.say("从前，有{hfull}。", "从前有{hfull}。",
                         "很久很久以前，在一个小村子里，住着{hfull}。",
                         "从前，在一座大森林里，住着{hfull}。")
                self._trait(housed=True)
            elif named:
                self.say("从前，有{hkindfull}，名叫{hname}。", "从前有{hkindfull}，{he}的名字叫{hname}。",
                         "从前有{hkindfull}，大家都叫{he}{hname}。")
                self._trait()
            else:
                self.say("从前，有{hkindfull}。", "从前有{hkindfull}。")
                self._trait(p=0.9, joined=rng.random() < 0.6)
        elif choice < 0.55:  # 有一天，小明……
            h.introduced = named  # a named hero is simply called by name here
            self.say("有一天，{hero}去了{place}。", "在一个{wday}的日子里，{hero}去了{place}。",
                     "一天早上，{hero}来到了{place}。", "有一天，{hero}一个人去了{place}。")
            self.at_place = True
            if named and (not h.human or rng.random() < 0.3):
                self.say("{hname}是{hkindfull}。", "{hname}是{hkindfull}，{he}很喜欢{hobby}。")
        elif choice < 0.65:
            self.say("很久以前，在一个遥远的地方，住着{hfull}。", "很久以前，有{hfull}。",
                     "在{home}，住着{hfull}。")
            self._trait(housed=True)
        elif choice < 0.73:
            self.say("从前，在{home}，住着{hfull}。", "从前有{hfull}，{he}住在{home}。")
            self._trait(p=0.5, housed=True)
        elif choice < 0.85 and named:
            housed = self.rng.random() < 0.4
            self.say("{hname}是{hkindfull}，住在{home}。" if housed else "{hname}是{hkindfull}，{he}很喜欢{hobby}。",
                     "{hname}是{hkindfull}。")
            self._trait(p=0.5, housed=housed)
        elif choice < 0.93 and not named:
            h.introduced = True
            housed = self.rng.random() < 0.33
            self.say("{hkind}住在{home}。" if housed else "{hadj}{hkind}很喜欢{hobby}。",
                     "一天早上，{hkind}很早就醒了。")
            self._trait(p=0.5, housed=housed)
        else:
            if named:
                h.introduced = True
                self.say("每天早上，{hname}都喜欢去{place}。", "{hname}最喜欢在{inplace}玩。")
                if not h.human or rng.random() < 0.3:
                    self.say("{hname}是{hkindfull}。")
            else:
                h.introduced = True
                self.say("每天早上，{hkind}都喜欢去{place}。")
            self.say("有一天，{he}又去了那里。", "在一个{wday}的日子里，{he}又去了那里。")
            self.at_place = True

    def _trait(self, p: float = 0.8, joined: bool = False, housed: bool = False) -> None:
        """A sentence about the hero; *joined* continues the opening: 从前有一只小狐狸，它……

        *housed*: the opening already said where the hero lives.
        """
        if self.rng.random() >= p:
            return
        clause = self.rng.choice([
            "很喜欢{hobby}", "很喜欢{hobby}" if housed else "住在{home}", "总是笑眯眯的", "总是很开心", "最喜欢在{inplace}玩",
            "最好的朋友是{ffull}", "有{a_obj}，那是{he}最心爱的东西", "最爱吃{foodn}",
            "每天都过得很开心",
        ]).format_map(self.ctx)
        if joined and self.sentences and self.sentences[-1].endswith("。"):
            self.sentences[-1] = self.sentences[-1][:-1] + "，" + self.hero.he + clause + "。"
        else:
            self.sentences.append(self.hero.he + clause + "。")

    # -- plots -------------------------------------------------------------------------
    def go_to_place(self, company: str = "") -> None:
        if self.at_place:
            self.maybe(0.5, "{wsent}", "那天是一个{wday}的日子。")
            return
        self.say("有一天，{hero}" + company + "去了{place}。",
                 "在一个{wday}的日子里，{hero}" + company + "去了{place}。",
                 "一天早上，{he}" + company + "去了{place}。",
                 "第二天，{hero}" + company + "去了{place}。")
        self.at_place = True

    def lost_found(self) -> None:
        if not self.at_place:
            self.say("{hero}有{a_obj}。", "{hero}有{a_obj}，那是{he}最心爱的东西。",
                     "{hero}有{a_obj}，{he}走到哪儿都带着它。")
            self.go_to_place("带着{his}{obj}")
        else:
            self.say("{he}带着心爱的{cobj}。", "{he}还带上了心爱的{cobj}。")
        self.place_detail(self.rng.choice([0, 1, 1]))
        self.say("{hero}拿着{obj}玩了好久。", "{he}" + self.place_activity() + "。",
                 "{hero}" + self.place_activity() + "，还玩了一会儿{obj}。")
        self.say("可是到了该回家的时候，{obj}不见了！", "{hero}低头一看，{obj}不见了！",
                 "忽然，{hero}发现{his}{obj}不见了。", "可是没过多久，{hero}就找不到{his}{obj}了。")
        self.say("{hero}{sad}。", "“我的{obj}去哪儿了？”{he}哭着说。", "“哎呀！我的{obj}！”{hero}叫了起来。")
        self.say("{he}到处找。", "{he}在{search1}下面找了找，又在{search2}后面找了找。",
                 "{he}找啊找，可就是找不到。")
        self.say("这时，{ffull}走了过来。", "就在这时，{hisfriend}来了。", "后来，{hero}遇见了{ffull}。")
        self.say("“你怎么了？”{fr}问。", "“你为什么难过呀？”{fr}问。")
        self.say("“我的{cobj}丢了。”{hero}说。", "{hero}把丢了{obj}的事告诉了{fr}。")
        self.say("“我来帮你找吧。”{fr}说。", "“我们一起找吧！”{fr}说。")
        self.maybe(0.6, "他们一起找了起来。", "他们找遍了每一个角落。", "他们把{place}找了个遍。")
        self.say("终于，{fr}在{spot}找到了{obj}。", "最后，他们在{spot}找到了{theobj}。",
                 "忽然，{hero}看见{spot}有一个{colour}东西。原来正是{his}{obj}！")
        self.say("{hero}{happy}。", "{hero}紧紧地抱住了{his}{obj}。", "{hero}高兴得跳了起来。")
        self.say("“谢谢你！”{he}对{fr}说。", "{he}一遍又一遍地谢谢{fr}。")
        self.say("从那天起，{hero}总是把{his}{obj}放在身边。", "然后，他们一起玩到了太阳下山。",
                 "{hero}和{fr}一起走回了家。", "{hero}再也没有弄丢过{his}{obj}。")

    def new_friend(self) -> None:
        self.go_to_place()
        self.place_detail(self.rng.choice([0, 1, 1, 2]))
        self.say("{he}想找人一起玩，可是那里一个人也没有。", "{hero}{lonely}。",
                 "{he}没有人一起玩，{lonely}。")
        self.say("这时，{hero}看见{ffull}正{doing}。", "这时，{he}看见{ffull}正{doing}。",
                 "忽然，{hero}听见一个小小的声音。原来是{ffull}。")
        if self.hero.name:
            self.say("“你好，”{hero}说，“我叫{hname}。你叫什么名字？”",
                     "“嗨！我是{hname}，”{hero}说，“你是谁呀？”")
        else:
            self.say("“你好，”{hero}说，“你想和我一起玩吗？”", "“嗨！”{hero}说，“你是谁呀？”")
        if self.friend.name:
            self.say("“我叫{fname}。”{fkind}说。", "“我的名字叫{fname}。”{fkind}说。")
        else:
            self.say("“我是一{fmeasure}{fkind}。”{fkind}说。", "{fkind}笑着挥了挥手。")
        self.maybe(0.6, "{fkind}有点害羞，可是{hero}对{fhe}笑了笑。",
                   "“你愿意和我一起玩吗？”{hero}问。", "一开始，{fr}{feeling}。")
        self.say("他们一起玩了{game}。", "他们在{inplace}玩了{game}。",
                 "他们一起" + self.place_activity() + "。")
        self.maybe(0.7, "{hero}把{his}{foodn}分给了{fr}。", "后来，他们坐在树下吃了{food}。",
                   "他们笑啊笑，笑个不停。")
        self.maybe(0.5, "太阳下山的时候，{fr}问：“你明天还来吗？”“来！”{hero}说。",
                   "“你是我的新朋友。”{fr}说。")
        self.say("从那天起，{hero}和{fr}成了最好的朋友。", "{hero}再也不孤单了。",
                 "{hero}开开心心地回家了。{he}交到了一个新朋友。", "现在，{hero}每天都有朋友一起玩了。")

    def trip(self) -> None:
        if self.at_place:
            self.say("{he}是和{his}{rel}一起去的。", "{his}{rel}也一起来了。")
        else:
            self.say("在一个{wday}的早上，{hero}和{his}{rel}去{place}玩。",
                     "{hero}和{his}{rel}要去{place}旅行。",
                     "有一天，{hero}的{rel}说：“我们去{place}吧！”")
            self.at_place = True
        self.say("他们是{by}去的。", "他们{by}去了那里。", "他们收拾好背包，{board}。")
        self.maybe(0.7, "在路上，{hero}看见了{sight}和{sight2}。", "{hero}一路上看见了{sight}。")
        self.say("到了{place}，{hero}{excited}。", "他们终于到了{place}。", "没过多久，他们就到了{place}。")
        self.place_detail(self.rng.choice([1, 2]))
        acts = self.place[3][:]
        self.rng.shuffle(acts)
        self.say("他们先" + acts[0] + "，然后" + acts[1] + "。", "{hero}" + acts[0] + "。",
                 "{hero}和{his}{rel}" + acts[0] + "。")
        self.maybe(0.8, "午饭的时候，他们吃了{food}。", "然后，他们吃了{food}当午饭。",
                   "{his}{rel}给了{he}{food}。")
        self.maybe(0.4, "{hero}捡到了{a_obj}，把它留了下来。", "{hero}买了{a_obj}带回家。")
        self.say("到了傍晚，{hero}虽然很累，可是{happy}。", "太阳下山了，他们回家了。",
                 "傍晚，他们{by}回家了。")
        self.say("在回家的路上，{he}睡着了。", "这真是最棒的一天！", "{hero}真想快点再去{place}。",
                 "“谢谢你带我出来玩！”{hero}对{his}{rel}说。")

    def problem(self) -> None:
        p = self.rng.choice(PROBLEMS)
        self.go_to_place()
        self.place_detail(self.rng.choice([0, 1, 1]))
        self.say("在那里，{hero}发现" + p[0] + "。", "这时，{hero}看见" + p[0] + "。", "哎呀！" + p[0] + "！")
        self.say("{hero}想" + p[1] + "，可是" + p[2] + "。", "{he}试着" + p[1] + "，可是" + p[2] + "。")
        self.say("{hero}{sad}。", "{he}坐下来想了想。", "“我该怎么办呢？”{hero}说。")
        self.maybe(0.5, "这时，{ffull}走了过来。", "{hisfriend}也来帮忙了。")
        self.say("忽然，{he}想到了一个好主意！", "{hero}眼睛一亮，有办法了！", "{hero}笑了。{he}知道该怎么做了。")
        self.say("{he}找来了" + p[3] + "，" + p[4] + "。", "{hero}找到了" + p[3] + "。{he}" + p[4] + "。")
        self.say("成功了！", "太好了，成功了！", "虽然不容易，可是成功了。")
        if p[5]:
            self.say(p[5] + "{happy}。", "“谢谢你！”" + p[5] + "说。")
        self.say("{hero}为自己感到骄傲。", "{hero}又开心又骄傲。", "大家都为{hero}欢呼。")
        self.say("{hero}明白了：只要肯动脑筋，几乎什么问题都能解决。", "{hero}明白了，遇到困难永远不要放弃。",
                 "那一天，{hero}学会了再试一次。", "然后，{hero}回家吃晚饭了。")

    def gift(self) -> None:
        made = self.rng.random() < 0.5
        self.meet_friend()
        self.say("明天就是{fr}的生日了。", "{fr}的生日快到了。", "{hero}想给{fr}一个惊喜。")
        self.maybe(0.4, "{hero}非常喜欢{fr}。", "他们每天都在一起玩。")
        self.say("{hero}想啊想：送什么好呢？", "可是{hero}不知道该送什么。", "{he}想找一件最好的礼物。")
        if made:
            self.say("忽然，{he}有了一个主意：{he}要亲手做{gift}。", "{he}决定自己做{gift}。")
            self.say("{he}忙了一整天。", "{he}做得非常认真。", "花了很长时间，可是{he}一直没有停下来。")
            item = "礼物"
        else:
            if not self.at_place:
                self.say("{he}去{place}找礼物。", "于是，{he}去了{place}。")
                self.at_place = True
            self.place_detail(self.rng.choice([0, 1]))
            self.say("在那里，{he}找到了{a_obj}。", "在那里，{hero}看见了{a_obj}。真是太合适了！",
                     "最后，{he}找到了{a_obj}。")
            item = self.obj[0]
        self.say("{he}用{colour2}纸把礼物包好，藏在了床底下。", "{he}把礼物放进一个盒子里，系上了{colour2}蝴蝶结。",
                 "{he}把礼物藏在了身后。")
        self.say("第二天，{hero}把礼物送给了{fr}。", "在生日会上，{hero}把盒子送给了{fr}。", "“惊喜！”{hero}说。")
        self.say("{fr}打开一看，笑了。", "{fr}看到" + item + "，{happy}。", "{fr}惊喜极了。")
        self.say("“谢谢你！我太喜欢了！”{fr}说。", "“这是我收到过的最好的礼物！”{fr}说。")
        self.maybe(0.7, "然后，他们一起吃了{food}，还玩了{game}。", "他们吃了蛋糕，唱了生日歌。",
                   "他们又唱又跳，玩了一下午。")
        self.say("{hero}心里暖暖的。", "送礼物也让{hero}{happy}。", "这真是美好的一天。", "{hero}和{fr}都开心极了。")

    def fear(self) -> None:
        f = self.rng.choice(FEARS)
        self.say("{hero}害怕" + f[0] + "。", "可是{hero}有一个秘密：{he}害怕" + f[0] + "。",
                 "{hero}什么都不怕，就怕" + f[0] + "。")
        self.say("每一次，{he}都会" + f[1] + "。", "{he}总是" + f[1] + "。")
        self.maybe(0.6, "一想到这个，{he}就{scared}。", "{he}真希望自己能勇敢一点。")
        if self.rng.random() < 0.7:
            self.say("有一天，{ffull}说：“跟我来，我会帮你的。”", "有一天，{hisfriend}说：“别害怕，有我在呢。”")
            self.say("{hero}{scared}，可是{he}深深地吸了一口气。", "{hero}紧紧地握住了{fr}的{fhand}。",
                     "{hero}本来不想去，可是{he}还是点了点头。")
        else:
            self.say("有一天，{his}{rel}说：“我们一起试试吧。”")
            self.say("{hero}{scared}，可是{he}深深地吸了一口气。", "{hero}紧紧地拉住了{rel}的手。")
        self.say("慢慢地，{he}" + f[2] + "。", "{he}鼓起勇气，" + f[2] + "。")
        self.say("原来一点也不可怕！而且还很好玩呢。", "什么坏事也没有发生。", "一点儿也不吓人。")
        self.say("{hero}觉得自己又勇敢又骄傲。", "{hero}露出了大大的笑容。", "{hero}为自己感到非常骄傲。")
        self.say("从那以后，{hero}再也不害怕" + f[0] + "了。", "现在，{hero}知道自己也可以很勇敢。",
                 "{hero}明白了：勇敢就是害怕的时候也敢去试一试。")

    def contest(self) -> None:
        c = self.rng.choice(CONTESTS)
        prize, pm = self.rng.choice(PRIZES)
        if self.at_place:
            self.say("那里马上要举行一场" + c[0] + "。", "{he}看见一张告示，上面写着{inplace}要举行" + c[0] + "。")
        else:
            self.say("{inplace}马上要举行一场" + c[0] + "。", "有一天，{hero}听说{inplace}要举行一场" + c[0] + "。")
        self.say("{hero}很想赢。", "{hero}很想赢得那" + pm + prize + "。", "{he}想去试一试。")
        self.say("于是，{he}" + c[1] + "。", "{hero}开始认真练习，" + c[1] + "。")
        self.maybe(0.6, "有时候{he}很累，可是{he}没有放弃。", "{his}{rel}也来帮{he}练习。")
        self.say("比赛那天，很多小动物和小朋友都来到了{place}。", "终于，比赛的日子到了。")
        self.maybe(0.6, "{hero}{scared}。", "{hero}{excited}。")
        if self.friend.introduced:
            self.say("{fr}也参加了比赛。", "{fr}也来了，{fhe}也很厉害。")
        else:
            self.say("{ffull}也来参加比赛了，{fhe}很厉害。", "{hero}看见{ffull}也来了，{fhe}也很厉害。")
        self.say("{hero}" + c[2] + "。", "轮到{hero}了，{he}" + c[2] + "。")
        if self.rng.random() < 0.5:
            self.say("{hero}赢了！{he}得到了一" + pm + "{colour}" + prize + "。",
                     "大家都拍起手来。{hero}赢得了一" + pm + "{colour}" + prize + "！")
            self.say("{hero}{happy}。", "{he}把" + prize + "拿给{fr}看。")
            self.say("{he}明白了：多练习，就能越来越好。", "这真是最棒的一天。",
                     "那天晚上，{hero}把" + prize + "放在了床头。")
        else:
            self.say("可是{fr}赢得了" + prize + "。", "{fr}赢了，{hero}得了第二名。")
            self.say("{hero}有点难过，不过很快就好了。", "{hero}一点也不难过。")
            self.say("{he}玩得很开心，这才是最重要的。", "{he}对{fr}说：“你真棒！”他们还是好朋友。",
                     "{he}明白了：开心比赢更重要。")

    def helping(self) -> None:
        task = self.rng.choice(HELP_TASKS)
        old, oref = self.rng.choice(OLD_ONES)
        self.go_to_place()
        self.place_detail(self.rng.choice([0, 1]))
        self.say("在那里，{hero}看见" + old + "正提着" + task[0] + "。",
                 "在路上，{hero}遇见了" + old + "。" + oref + "正拿着" + task[0] + "。")
        self.say(oref + "累得直喘气。", "东西太重了，" + oref + "拿不动。")
        self.say("“我来帮您吧！”{hero}说。", "“让我帮帮您吧。”{hero}说。")
        self.say("“哎呀，谢谢你。”" + oref + "说。", oref + "笑了。")
        self.say("他们一起把东西" + task[1] + "。", "{hero}一路帮" + oref + "把东西" + task[1] + "。")
        self.maybe(0.8, "为了表示感谢，" + oref + "送给{hero}{food}。", "为了谢谢{hero}，" + oref + "送给{he}{a_obj}。")
        self.say("{hero}{happy}。", "{hero}一路笑着回了家。")
        self.say("{he}明白了，帮助别人是一件快乐的事。", "帮助别人让{hero}心里暖暖的。",
                 "从那以后，{hero}每个星期都去帮" + oref + "。")

    def rainy_day(self) -> None:
        w = self.rng.choice([("下雨", "外面下着大雨。", "雨停了"), ("下雪", "外面飘着大雪。", "雪停了"),
                             ("刮大风", "外面风很大，雨也下个不停。", "风停了"),
                             ("寒冷", "外面太冷了，不能出门。", "太阳出来了")])
        self.say("在一个" + w[0] + "的日子里，{hero}只好待在家里。" + w[1], w[1] + "{hero}不能去{place}了。")
        self.say("{hero}{bored}。", "“好无聊啊。”{hero}说。")
        self.say("{his}{rel}说：“我们来玩个游戏吧。”", "这时，{hero}想到了一个主意。{he}去找{his}{rel}。")
        acts = ["用毯子和枕头搭了一座小城堡", "烤了一盘饼干", "画了一幅{place}的画", "演了一场木偶戏",
                "读了一本讲动物的书", "玩了{his}{cobj}", "和玩具们开了一个茶话会", "在窗户上画画"]
        self.rng.shuffle(acts)
        self.say("他们" + acts[0] + "。", "他们先" + acts[0] + "，然后" + acts[1] + "。", "{hero}" + acts[0] + "。")
        self.maybe(0.7, "然后，他们吃了{food}。", "他们一边喝热牛奶，一边吃{foodn}。")
        self.maybe(0.5, "{ffull}也来一起玩了。", "后来，{ffull}来敲门了。")
        self.say("到了傍晚，" + w[2] + "。", "很快就到了睡觉的时间。", "一天很快就过去了。")
        self.say("{hero}说：“今天真好玩！”", "{hero}明白了，" + w[0] + "的日子也可以很有趣。",
                 "{hero}开开心心地睡觉了。")


def generate_story_zh(rng: random.Random) -> str:
    """One story drawn with *rng* (MIN_CHARS to MAX_CHARS characters)."""
    while True:
        story = _Story(rng)
        story.opening()
        plot = rng.choice(PLOTS)
        if plot == "rainy_day" and story.at_place:  # cannot stay inside once out
            plot = rng.choice(PLOTS[:-1])
        getattr(story, plot)()
        text = story.text()
        if MIN_CHARS <= len(text) <= MAX_CHARS:
            return text


def generate_stories_zh(n: int, seed: int = 0) -> list[str]:
    """*n* stories, deterministic for *seed* (uses its own ``random.Random(seed)``)."""
    rng = random.Random(seed)
    return [generate_story_zh(rng) for _ in range(n)]


_ALLOWED = re.compile(r"[\u4e00-\u9fff" + PUNCTUATION + r"]+")


def is_clean(text: str) -> bool:
    """True when *text* has only Han ideographs and the full-width punctuation of PUNCTUATION."""
    return bool(_ALLOWED.fullmatch(text))


if __name__ == "__main__":  # pragma: no cover - a quick look at the corpus
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for s in generate_stories_zh(args.n, args.seed):
        print(s, end="\n\n")
