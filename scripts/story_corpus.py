"""Seeded generator of simple synthetic English short stories.

This is the training corpus of minillm's tiny default model (``minillm/assets/stories-3m``).
Stories come from a hand-written grammar: a hero (a child, a named animal or an unnamed
creature), a friend, a place, an object, a food and the weather are drawn at the start of
each story and carried through it, so that a prompt naming a hero, an animal or a place
leads to a story about them. Several plot shapes (lost and found, making a friend, a trip,
a problem solved, a surprise gift, a fear overcome, a contest, helping someone, a rainy
day) and many sentence variants give the next-token distributions real choices.

Everything is driven by one ``random.Random(seed)``, so ``generate_stories(n, seed)`` is
deterministic: the same seed always gives the same stories, on any machine.

    >>> from story_corpus import generate_stories
    >>> stories = generate_stories(3, seed=0)
"""

from __future__ import annotations

import random
import re

__all__ = [
    "generate_stories",
    "generate_story",
    "GIRL_NAMES",
    "BOY_NAMES",
    "ANIMALS",
    "CREATURES",
    "PLACES",
    "OBJECTS",
    "FEELINGS",
    "COLOURS",
    "FOODS",
    "WEATHER",
    "PLOTS",
    "MIN_WORDS",
    "MAX_WORDS",
]

MIN_WORDS = 60
MAX_WORDS = 180

# ---------------------------------------------------------------------------------------
# Vocabulary of the grammar
# ---------------------------------------------------------------------------------------

GIRL_NAMES = [
    "Mia", "Lily", "Emma", "Sara", "Anna", "Zoe", "Ella", "Lucy", "Ruby", "Nora",
    "Ava", "Grace", "Chloe", "Maya", "Rosa", "Ivy", "Hannah", "Leah", "Julia", "Amy",
    "Daisy", "Molly", "Kate", "Tina", "Luna",
]
BOY_NAMES = [
    "Tom", "Ben", "Sam", "Leo", "Max", "Jack", "Finn", "Noah", "Oscar", "Theo",
    "Eli", "Hugo", "Owen", "Adam", "Luke", "Milo", "Jake", "Toby", "Dan", "Ryan",
    "Pete", "Kai", "Oliver", "Felix", "Timmy",
]

# Animals that can be heroes or friends. (noun, plural is not needed.)
ANIMALS = [
    "fox", "rabbit", "bunny", "bear", "cat", "dog", "puppy", "kitten", "mouse", "owl",
    "duck", "frog", "turtle", "squirrel", "deer", "lion", "tiger", "elephant", "monkey",
    "pig", "cow", "horse", "sheep", "goat", "hen", "penguin", "whale", "fish", "bird",
    "hedgehog", "badger", "wolf", "giraffe", "zebra", "panda", "koala", "otter",
    "raccoon", "bee", "ladybug", "snail", "crab", "parrot", "lamb", "pony",
]
# Creatures that are not animals but can be heroes too.
CREATURES = ["robot", "dragon", "dinosaur", "unicorn", "fairy", "troll", "snowman", "train"]

HERO_ADJECTIVES = [
    "little", "small", "tiny", "young", "kind", "happy", "brave", "curious", "shy",
    "clever", "friendly", "silly", "busy", "gentle", "sleepy", "cheerful",
]
FRIEND_ADJECTIVES = ["little", "small", "big", "old", "friendly", "shy", "funny", "kind", "wise", "young"]

# (place, preposition "you are ... the place", [details], [activities in past tense])
PLACES = [
    ("the park", "at", ["The grass was green and soft.", "There were tall trees and a big slide."],
     ["played on the swings", "ran across the grass"]),
    ("the beach", "at", ["The sand was warm and the waves were big.", "Little crabs ran across the sand."],
     ["built a sandcastle", "jumped over the waves"]),
    ("the forest", "in", ["The trees were very tall and old.", "Birds sang high up in the branches."],
     ["picked berries", "listened to the birds"]),
    ("the garden", "in", ["There were roses and tulips everywhere.", "Bees buzzed around the flowers."],
     ["watered the flowers", "dug in the soft dirt"]),
    ("the farm", "on", ["There were cows, pigs and hens.", "The barn was big and red."],
     ["fed the hens", "rode on the tractor"]),
    ("the lake", "at", ["The water was calm and blue.", "Ducks swam near the shore."],
     ["skipped stones on the water", "fed the ducks"]),
    ("the river", "by", ["The water splashed over the rocks.", "Fish jumped out of the water."],
     ["sailed a paper boat", "looked for frogs"]),
    ("the hill", "on", ["From the top you could see the whole town.", "The wind blew hard up there."],
     ["rolled down the grass", "watched the clouds"]),
    ("the meadow", "in", ["It was full of yellow flowers.", "Butterflies danced in the air."],
     ["picked flowers", "chased butterflies"]),
    ("the zoo", "at", ["There were lions, monkeys and a tall giraffe.", "The elephants splashed in the water."],
     ["watched the monkeys", "fed the goats"]),
    ("the school", "at", ["The classroom had bright pictures on the walls.", "The teacher smiled at everyone."],
     ["painted a picture", "sang songs"]),
    ("the library", "in", ["There were books on every shelf.", "It was very quiet."],
     ["read a book about dragons", "looked at picture books"]),
    ("the market", "at", ["People were selling fruit and bread.", "It was busy and loud."],
     ["bought some apples", "looked at all the stalls"]),
    ("the village", "in", ["The houses had red roofs.", "There was a well in the middle of the square."],
     ["visited the baker", "said hello to the neighbours"]),
    ("the town", "in", ["The streets were full of people.", "A big clock stood on the tower."],
     ["looked in the shop windows", "ate ice cream in the square"]),
    ("the mountain", "on", ["The air was cold and fresh.", "There was snow at the very top."],
     ["climbed up the path", "looked at the clouds below"]),
    ("the cave", "in", ["It was dark and cool inside.", "Water dripped from the rocks."],
     ["shone a light on the walls", "listened to the echo"]),
    ("the playground", "at", ["There was a slide, a sandbox and two swings.", "Children were laughing everywhere."],
     ["went down the slide", "played in the sandbox"]),
    ("the pond", "by", ["Green lily pads floated on the water.", "A frog sat on a rock."],
     ["looked for tadpoles", "threw bread to the ducks"]),
    ("the castle", "at", ["It had high towers and a big gate.", "Flags waved from the walls."],
     ["explored the old halls", "climbed the tall tower"]),
    ("the bakery", "at", ["It smelled of warm bread.", "There were cakes in the window."],
     ["ate a warm bun", "watched the baker make bread"]),
    ("the toy shop", "at", ["There were toys on every shelf.", "A toy train went round and round."],
     ["played with the toy train", "looked at the dolls"]),
    ("the museum", "at", ["There were the old bones of a dinosaur.", "Paintings hung on the walls."],
     ["looked at the dinosaur bones", "saw a painting of the sea"]),
    ("the field", "in", ["The grass was tall and gold.", "A scarecrow stood in the middle."],
     ["ran through the tall grass", "flew a kite"]),
    ("the island", "on", ["Palm trees swayed in the wind.", "The sea was all around."],
     ["looked for shells", "swam in the sea"]),
    ("the city", "in", ["There were tall buildings and busy streets.", "Cars and buses went by."],
     ["rode on a bus", "went to the top of a tall building"]),
    ("the woods", "in", ["The path was covered with leaves.", "Squirrels ran up the trees."],
     ["collected pine cones", "built a little hut of sticks"]),
    ("the harbor", "at", ["Big ships were in the water.", "Seagulls cried over the boats."],
     ["watched the ships", "talked to a fisherman"]),
    ("the orchard", "in", ["There were apple trees in long rows.", "The air smelled sweet."],
     ["picked red apples", "climbed an apple tree"]),
    ("the jungle", "in", ["It was hot and green.", "Parrots called from the trees."],
     ["swung on a vine", "looked for monkeys"]),
    ("the circus", "at", ["There was a big tent with red and white stripes.", "Clowns ran around and made everyone laugh."],
     ["watched the clowns", "clapped for the acrobats"]),
    ("the swimming pool", "at", ["The water was blue and clear.", "Children splashed and laughed."],
     ["swam from one side to the other", "jumped into the water"]),
]

OBJECTS = [
    "ball", "kite", "hat", "scarf", "book", "doll", "teddy bear", "toy boat", "toy car",
    "toy train", "drum", "whistle", "shell", "stone", "key", "ring", "box", "bag", "cup",
    "blanket", "umbrella", "boot", "sock", "crayon", "pencil", "map", "lamp", "bell",
    "feather", "button", "coin", "necklace", "bucket", "shovel", "basket", "balloon",
    "puzzle", "glove", "marble", "clock", "flag", "spinning top", "jump rope", "backpack",
    "watch", "bracelet", "ribbon", "flute", "paintbrush", "sticker",
]

COLOURS = ["red", "blue", "green", "yellow", "pink", "purple", "orange", "white", "black",
           "brown", "golden", "silver", "shiny", "striped", "spotted"]

FEELINGS = [
    "happy", "sad", "scared", "excited", "proud", "angry", "tired", "lonely", "worried",
    "surprised", "curious", "calm", "brave", "shy", "grumpy", "nervous", "glad", "upset",
]
SAD_FEELINGS = ["sad", "upset", "worried", "very sad", "sad and worried"]
HAPPY_FEELINGS = ["happy", "glad", "very happy", "so happy", "full of joy"]
SCARED_FEELINGS = ["scared", "nervous", "afraid", "a little scared"]
LONELY_FEELINGS = ["lonely", "a little lonely", "bored and lonely", "sad and alone"]

# (phrase with article, short noun to refer back)
FOODS = [
    ("an apple", "apple"), ("a piece of cake", "cake"), ("a cookie", "cookie"),
    ("a sandwich", "sandwich"), ("some apple pie", "pie"), ("some warm soup", "soup"),
    ("some bread and honey", "bread"), ("some cheese", "cheese"), ("a carrot", "carrot"),
    ("a banana", "banana"), ("some berries", "berries"), ("some pancakes", "pancakes"),
    ("a muffin", "muffin"), ("some ice cream", "ice cream"), ("some grapes", "grapes"),
    ("some cherries", "cherries"), ("a pear", "pear"), ("some nuts", "nuts"),
    ("a cupcake", "cupcake"), ("some pizza", "pizza"), ("a plum", "plum"),
    ("some popcorn", "popcorn"),
]

# (adjective for "One <w> day", sentence describing it)
WEATHER = [
    ("sunny", "The sun was shining."),
    ("rainy", "It was raining."),
    ("windy", "The wind was blowing hard."),
    ("snowy", "Snow was falling softly."),
    ("cloudy", "Grey clouds filled the sky."),
    ("foggy", "There was fog everywhere."),
    ("warm", "The air was warm."),
    ("cold", "It was very cold."),
    ("bright", "The sky was clear and blue."),
]

RELATIVES = [("mom", "f"), ("dad", "m"), ("grandma", "f"), ("grandpa", "m"),
             ("big sister", "f"), ("big brother", "m"), ("aunt", "f"), ("uncle", "m")]

HOBBIES = [
    "singing", "dancing", "reading books", "painting", "playing ball", "climbing trees",
    "building things", "looking at the stars", "running fast", "telling jokes",
    "baking cakes", "drawing pictures", "playing music", "swimming", "counting things",
]

HOMES = [
    "in a small house by the sea", "in a hole under a big tree", "on a busy farm",
    "in a little house in the woods", "in a big city", "near a quiet river",
    "in a cosy house with a green door", "at the edge of a small village",
    "on top of a tall hill", "in a garden full of flowers",
]

HIDING_SPOTS = [
    "under a bush", "behind a big rock", "next to a bench", "in the tall grass",
    "under a pile of leaves", "near the water", "behind a tree", "under a wooden table",
    "inside an old box", "on a high branch",
]
SEARCH_SPOTS = ["the bushes", "the rocks", "the benches", "the trees", "the leaves", "the grass",
                "the tables", "the flowers"]

VEHICLES = ["car", "train", "bus", "boat", "bike", "big red bus", "little boat"]
SIGHTS = ["tall trees", "green hills", "a big river", "many cows", "little houses",
          "a rainbow", "sheep in a field", "a windmill", "a long bridge", "birds in the sky"]

GAMES = ["hide and seek", "tag", "catch", "a game of pretend", "a jumping game", "a guessing game"]

# (problem sentence, what the hero tried, why it failed, tool, what the tool did, who was happy)
PROBLEMS = [
    ("{a_obj} was stuck high up in a tree.", "jump up and grab it", "the branch was too high",
     "a long stick", "pushed the {obj} down", None),
    ("a little bird had fallen out of its nest.", "reach the nest", "the nest was too high",
     "a ladder", "put the bird back in its nest", "the mother bird"),
    ("the flowers were dry and sad.", "wait for rain", "no rain came",
     "a bucket of water", "watered every flower", None),
    ("a big rock was in the middle of the path.", "push the rock", "it was too heavy",
     "a strong rope", "pulled the rock away with the help of friends", None),
    ("the little boat had a hole in it.", "sail it anyway", "water came in",
     "a piece of tape", "covered the hole", None),
    ("a kitten was stuck on the roof.", "call the kitten down", "the kitten was too scared",
     "a ladder", "carried the kitten down", "the kitten"),
    ("the bridge over the stream was broken.", "jump over the stream", "it was too wide",
     "some long logs", "built a new bridge", None),
    ("the ball rolled into the pond.", "reach the ball", "the water was too deep",
     "a fishing net", "scooped the ball out", None),
    ("the path home was dark.", "find the way", "it was too dark to see",
     "a small lamp", "lit the way home", None),
    ("the old wagon had a broken wheel.", "pull the wagon", "it would not move",
     "a new wheel", "fixed the wagon", None),
]

# (fear, what the hero did when afraid, how the hero faced it)
FEARS = [
    ("the dark", "hid under the blanket", "turned off the light and looked at the stars through the window"),
    ("the big dog next door", "ran away", "gave the dog a pat on the head"),
    ("deep water", "stayed on the shore", "put one foot in the water, then the other"),
    ("thunder", "covered both ears", "counted the seconds between the flash and the boom"),
    ("the tall slide", "walked the other way", "climbed up the ladder and slid down"),
    ("the old dark cave", "stayed far away", "walked into the cave with a lamp"),
    ("the big waves", "sat in the sand", "jumped over a little wave"),
    ("climbing trees", "stayed on the ground", "climbed up to the first branch"),
    ("the wobbly bridge", "would not go near it", "walked across the bridge one step at a time"),
    ("bees", "ran inside", "sat still and watched a bee drink from a flower"),
    ("the first day of school", "cried at the door", "walked into the classroom and said hello"),
]

# (contest name, verb phrase for practising, verb phrase for doing it, prize)
CONTESTS = [
    ("race", "ran every morning", "ran as fast as the wind"),
    ("baking contest", "baked a cake every day", "baked a big chocolate cake"),
    ("drawing contest", "drew pictures every day", "drew a picture of a rainbow"),
    ("singing contest", "sang songs every evening", "sang a sweet song"),
    ("jumping contest", "jumped over logs every day", "jumped higher than ever"),
    ("kite contest", "flew kites every afternoon", "flew a kite high into the sky"),
    ("sandcastle contest", "built castles every day", "built a castle with four towers"),
    ("dancing contest", "danced every night", "danced a happy dance"),
    ("swimming race", "swam every morning", "swam as fast as a fish"),
]
PRIZES = ["medal", "cup", "ribbon", "star", "crown", "trophy"]

# (what the old one was carrying, where it was going)
HELP_TASKS = [
    ("a heavy basket of apples", "home"), ("a big bag of flour", "to the bakery"),
    ("a pile of wood", "home"), ("a bucket of water", "to the garden"),
    ("a heavy box of books", "to the library"), ("a sack of carrots", "to the market"),
    ("a basket of eggs", "home"), ("a big pot of soup", "to a friend"),
]

GIFTS_MADE = ["a card with a big heart on it", "a necklace of shells", "a crown of flowers",
              "a picture of the two of them", "a little cake", "a paper boat",
              "a bracelet of beads", "a song"]

PLOTS = ["lost_found", "new_friend", "trip", "problem", "gift", "fear", "contest", "helping", "rainy_day"]


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def an(phrase: str) -> str:
    """'a' or 'an' before *phrase*."""
    vowel = phrase[0].lower() in "aeiou" and not phrase.lower().startswith(("uni", "use", "one"))
    return ("an " if vowel else "a ") + phrase


_PRONOUNS = {
    "f": {"he": "she", "him": "her", "his": "her", "himself": "herself"},
    "m": {"he": "he", "him": "him", "his": "his", "himself": "himself"},
    "n": {"he": "it", "him": "it", "his": "its", "himself": "itself"},
}


class Character:
    """A person, an animal or a creature in a story, referred to consistently."""

    def __init__(self, rng: random.Random, kind: str, gender: str, name: str | None, adj: str):
        self.rng = rng
        self.kind = kind
        self.gender = gender
        self.name = name
        self.adj = adj
        self.introduced = False

    @property
    def human(self) -> bool:
        return self.kind in ("girl", "boy")

    @property
    def animal(self) -> bool:
        return self.kind in ANIMALS

    def ref(self) -> str:
        """How the story names this character again (chosen afresh at each mention).

        Before the story has said what kind of being it is, a named character is called
        by its name only, and an unnamed one gets an indefinite first mention.
        """
        if self.name:
            if self.human or not self.introduced or self.rng.random() < 0.8:
                return self.name
            return "the " + self.kind
        if not self.introduced:
            self.introduced = True
            return an(self.adj + " " + self.kind)
        return "the " + (self.adj + " " if self.rng.random() < 0.7 else "") + self.kind

    def full(self) -> str:
        """First-mention description: 'a little fox named Finn', 'a shy robot'."""
        self.introduced = True
        base = an(self.adj + " " + self.kind)
        return base + (" named " + self.name if self.name else "")

    def kindfull(self) -> str:
        """'a little fox' (no name)."""
        self.introduced = True
        return an(self.adj + " " + self.kind)

    def pro(self, which: str) -> str:
        return _PRONOUNS[self.gender][which]

    def hand(self) -> str:
        return "paw" if self.animal else "hand"


class _Ctx(dict):
    """format_map mapping whose values may be re-drawn at each use (callables)."""

    def __getitem__(self, key: str) -> str:
        cap = key[0].isupper()
        k = key if key in self.keys() else key[0].lower() + key[1:]
        value = dict.__getitem__(self, k)
        if callable(value):
            value = value()
        if cap:
            value = value[0].upper() + value[1:]
        return value


def _cap(sentence: str) -> str:
    for i, ch in enumerate(sentence):
        if ch.isalpha():
            return sentence[:i] + ch.upper() + sentence[i + 1:]
    return sentence


# ---------------------------------------------------------------------------------------
# Story builder
# ---------------------------------------------------------------------------------------

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
        self.at_place = False  # the opening already took the hero to the place
        h, f = self.hero, self.friend
        rel = self.relative[0]
        self.ctx = _Ctx(
            hero=h.ref, he=lambda: h.pro("he"), him=lambda: h.pro("him"),
            his=lambda: h.pro("his"), himself=lambda: h.pro("himself"),
            fr=f.ref, fhe=lambda: f.pro("he"), fhim=lambda: f.pro("him"),
            fhis=lambda: f.pro("his"), ffull=f.full, fkind=f.kind,
            hkind=h.kind, hadj=h.adj, hfull=h.full, hand=h.hand, fhand=f.hand,
            place=self.place[0], inplace=self.place[1] + " " + self.place[0],
            obj=self.obj, colour=self.colour, cobj=self.colour + " " + self.obj,
            a_obj=an(self.colour + " " + self.obj),
            food=self.food[0], foodn=self.food[1],
            wday=self.weather[0], wsent=self.weather[1],
            rel=rel, rhe=_PRONOUNS[self.relative[1]]["he"],
            sad=lambda: rng.choice(SAD_FEELINGS), happy=lambda: rng.choice(HAPPY_FEELINGS),
            scared=lambda: rng.choice(SCARED_FEELINGS), lonely=lambda: rng.choice(LONELY_FEELINGS),
            feeling=lambda: rng.choice(FEELINGS),
        )

    # -- characters --------------------------------------------------------------------
    def _character(self, hero: bool, avoid: Character | None = None) -> Character:
        rng = self.rng
        used = {avoid.name, avoid.kind} if avoid else set()
        r = rng.random()
        adjs = HERO_ADJECTIVES if hero else FRIEND_ADJECTIVES
        while True:
            if r < 0.42:  # a child
                gender = rng.choice("fm")
                kind = "girl" if gender == "f" else "boy"
                name = rng.choice(GIRL_NAMES if gender == "f" else BOY_NAMES)
            elif r < (0.82 if hero else 0.9):  # a named animal or creature
                gender = rng.choice("fm")
                kind = rng.choice(ANIMALS) if rng.random() < 0.85 else rng.choice(CREATURES)
                name = rng.choice(GIRL_NAMES if gender == "f" else BOY_NAMES)
            else:  # an unnamed animal or creature, "it"
                gender = "n"
                kind = rng.choice(CREATURES) if rng.random() < 0.5 else rng.choice(ANIMALS)
                name = None
            if name not in used and kind not in used or (name is None and kind not in used):
                break
        return Character(rng, kind, gender, name, rng.choice(adjs))

    # -- writing -----------------------------------------------------------------------
    def say(self, *options: str) -> None:
        """Add one sentence (or a few), picking one of *options*."""
        text = self.rng.choice(options).format_map(self.ctx)
        self.sentences.append(" ".join(_cap(s) for s in _split_keep(text)))

    def maybe(self, p: float, *options: str) -> None:
        if self.rng.random() < p:
            self.say(*options)

    def text(self) -> str:
        return " ".join(self.sentences)

    def place_detail(self, n: int = 1) -> None:
        details = self.place[2][:]
        self.rng.shuffle(details)
        for d in details[:n]:
            self.sentences.append(d)

    def place_activity(self) -> str:
        return self.rng.choice(self.place[3])

    # -- openings ----------------------------------------------------------------------
    def opening(self) -> None:
        rng, h = self.rng, self.hero
        named = h.name is not None
        choice = rng.random()
        if choice < 0.40:
            if named and rng.random() < 0.5:
                self.say("Once upon a time, there was {hfull}.",
                         "Once upon a time, there was {hfull}.",
                         "Once upon a time, in a small village, there lived {hfull}.",
                         "Once upon a time, there lived {hfull}.")
            elif named:
                h.introduced = True
                self.sentences.append(f"Once upon a time, there was {an(h.kind)} named {h.name}.")
            else:
                self.say("Once upon a time, there was {hfull}.", "Once upon a time, there lived {hfull}.")
            self._trait()
        elif choice < 0.55:
            self.say("One day, {hero} went to {place}.", "One {wday} day, {hero} went to {place}.",
                     "One morning, {hero} went to {place}.")
            self.at_place = True
            if named and (not h.human or rng.random() < 0.3):
                self.say("{Hero} was {hkindfull}.", "{Hero} was {hkindfull} who loved {hobby}.")
        elif choice < 0.65:
            self.say("There was once {hfull}.", "There was {hfull} who lived {home}.",
                     "There was {hfull}.")
            self._trait()
        elif choice < 0.73:
            self.say("Long ago, in a faraway land, there lived {hfull}.", "Long ago, there was {hfull}.")
            self._trait()
        elif choice < 0.85 and named:
            self.say("{Hero} was {hkindfull} who loved {hobby}.", "{Hero} was {hkindfull} who lived {home}.",
                     "{Hero} was {hkindfull}.")
            self._trait(p=0.5)
        elif choice < 0.93 and not named:
            h.introduced = True
            self.say("The {hadj} {hkind} lived {home}.", "The {hadj} {hkind} loved {hobby}.",
                     "The {hadj} {hkind} woke up early one morning.")
            self._trait(p=0.5)
        else:
            if named:
                self.say("Every morning, {hero} liked to go to {place}.", "{Hero} loved to play {inplace}.")
                if not h.human or rng.random() < 0.3:
                    self.say("{Hero} was {hkindfull}.")
            else:
                h.introduced = True
                self.say("Every morning, the {hadj} {hkind} liked to go to {place}.")
            self.say("One day, {he} went there again.", "One {wday} day, {he} went there again.")
            self.at_place = True

    def _trait(self, p: float = 0.8) -> None:
        self.maybe(p,
                   "{He} loved {hobby}.", "{He} lived {home}.", "{He} was always {feeling}.",
                   "{He} liked to play {inplace}.", "{His} best friend was {ffull}.",
                   "{He} had {a_obj} that {he} loved very much.", "{He} loved to eat {food}.")

    # -- plots -------------------------------------------------------------------------
    def go_to_place(self, company: str = "") -> None:
        if self.at_place:
            self.maybe(0.5, "{Wsent}", "It was {a_wday} day.")
            return
        self.say("One day, {hero} went to {place}" + company + ".",
                 "One {wday} day, {hero} went to {place}" + company + ".",
                 "One morning, {he} went to {place}" + company + ".",
                 "The next day, {hero} went to {place}" + company + ".")
        self.at_place = True

    def lost_found(self) -> None:
        if not self.at_place:
            self.say("{Hero} had {a_obj}.", "{Hero} had {a_obj}. It was {his} favourite thing.",
                     "{Hero} had {a_obj}. {He} took it everywhere.")
            self.go_to_place(" with {his} {obj}")
        else:
            self.say("{He} took {his} {cobj} with {him}.", "{He} had {his} {cobj} with {him}.")
        self.place_detail(self.rng.choice([0, 1, 1, 2]))
        self.say("{Hero} played with the {obj} for a long time.", "{He} " + self.place_activity() + ".",
                 "{Hero} " + self.place_activity() + " and played with the {obj}.")
        self.say("But when it was time to go home, the {obj} was gone!",
                 "Then {hero} looked down. The {obj} was not there!",
                 "Suddenly, {hero} saw that {his} {obj} was gone.",
                 "But soon {hero} could not find {his} {obj}.")
        self.say("{Hero} felt {sad}.", "{He} was {sad}.", "\"Where is my {obj}?\" {he} cried.",
                 "\"Oh no! My {obj}!\" said {hero}.")
        self.say("{He} looked everywhere.", "{He} looked under {search1} and behind {search2}.",
                 "{He} looked and looked, but {he} could not find it.")
        self.say("Then {ffull} came by.", "Just then, {his} friend {fr} came along.",
                 "Then {hero} met {ffull}.")
        self.say("\"What is wrong?\" asked {fr}.", "\"Why are you sad?\" asked {fr}.")
        self.say("\"I lost my {cobj},\" said {hero}.", "{Hero} told {fr} about the {obj}.")
        self.say("\"I will help you,\" said {fr}.", "\"Let us look together,\" said {fr}.")
        self.say("They looked together.", "They looked high and low.", "They searched all over {place}.")
        self.say("At last, {fr} found the {obj} {spot}.", "At last, they found the {obj} {spot}.",
                 "Then {hero} saw something {colour} {spot}. It was the {obj}!")
        self.say("{Hero} was {happy}.", "{Hero} hugged {his} {obj}.", "{Hero} jumped for joy.")
        self.say("\"Thank you!\" {he} said to {fr}.", "{He} thanked {fr} again and again.")
        self.say("From that day on, {hero} always kept {his} {obj} close.",
                 "Then they played together until the sun went down.",
                 "{Hero} and {fr} walked home together, and the {obj} was safe.",
                 "{Hero} never lost {his} {obj} again.")

    def new_friend(self) -> None:
        self.go_to_place()
        self.place_detail(self.rng.choice([0, 1, 1, 2]))
        self.say("{He} wanted someone to play with, but there was no one there.",
                 "{Hero} felt {lonely}.", "{He} had no one to play with, and {he} felt {lonely}.")
        self.say("Then {hero} saw {ffull} {doing}.", "Then {he} saw {ffull} {doing}.",
                 "Suddenly, {hero} heard a small voice. It was {ffull}.")
        if self.hero.name:
            self.say("\"Hello,\" said {hero}. \"My name is {hname}. What is your name?\"",
                     "\"Hi! I am {hname},\" said {hero}. \"Who are you?\"")
        else:
            self.say("\"Hello,\" said {hero}. \"Do you want to play?\"",
                     "\"Hi!\" said {hero}. \"Who are you?\"")
        if self.friend.name:
            self.say("\"I am {fname},\" said the {fkind}.", "\"My name is {fname},\" said the {fkind}.")
        else:
            self.say("\"I am a {fkind},\" said the {fkind}.", "The {fkind} smiled and waved.")
        self.maybe(0.6, "The {fkind} was shy, but {hero} smiled at {fhim}.",
                   "\"Will you play with me?\" asked {hero}.", "{Fr} was {feeling} at first.")
        self.say("They played {game} together.", "They played {game} {inplace}.",
                 "They " + self.place_activity() + " together.")
        self.maybe(0.7, "{Hero} shared {his} {foodn} with {fr}.",
                   "Then they ate {food} under a tree.", "They laughed and laughed.")
        self.maybe(0.5, "When the sun went down, {fr} asked, \"Will you come back tomorrow?\" \"Yes!\" said {hero}.",
                   "\"You are my new friend,\" said {fr}.")
        self.say("From that day on, {hero} and {fr} were best friends.",
                 "{Hero} was not lonely anymore.",
                 "{Hero} went home {happy}. {He} had made a new friend.",
                 "Now {hero} had a friend to play with every day.")

    def trip(self) -> None:
        if self.at_place:
            self.say("{He} went with {his} {rel}.", "{His} {rel} came too.")
        else:
            self.say("One {wday} morning, {hero} and {his} {rel} went on a trip to {place}.",
                     "{Hero} and {his} {rel} went on a trip to {place}.",
                     "One day, {hero}'s {rel} said, \"Let us go to {place}!\"")
            self.at_place = True
        self.say("They went by {vehicle}.", "They went there by {vehicle}.", "They packed a bag and got on a {vehicle}.")
        self.maybe(0.7, "On the way, {hero} saw {sight} and {sight2}.", "{Hero} looked out and saw {sight}.")
        self.say("When they got to {place}, {hero} felt {excited}.", "At last they were {inplace}.",
                 "Soon they arrived {inplace}.")
        self.place_detail(self.rng.choice([1, 2]))
        acts = self.place[3][:]
        self.rng.shuffle(acts)
        self.say("First, they " + acts[0] + ". Then they " + acts[1] + ".",
                 "{Hero} " + acts[0] + ".", "{Hero} and {his} {rel} " + acts[0] + ".")
        self.maybe(0.8, "For lunch, they ate {food}.", "Then they had {food} for lunch.",
                   "{His} {rel} gave {him} {food}.")
        self.maybe(0.4, "{Hero} found {a_obj} and kept it.", "{Hero} bought {a_obj} to take home.")
        self.say("At the end of the day, {hero} was tired but {happy}.",
                 "When the sun went down, they went home.",
                 "In the evening, they went back home by {vehicle}.")
        self.say("{He} fell asleep on the way home.", "It was the best day ever.",
                 "{Hero} wanted to go back to {place} again soon.",
                 "\"Thank you for the trip,\" said {hero} to {his} {rel}.")

    def problem(self) -> None:
        p = self.rng.choice(PROBLEMS)
        self.go_to_place()
        self.place_detail(self.rng.choice([0, 1, 1]))
        self.say("There {hero} saw that " + p[0], "Then {hero} saw that " + p[0],
                 "Oh no! " + p[0])
        self.say("{Hero} tried to " + p[1] + ", but " + p[2] + ".",
                 "{He} tried to " + p[1] + ". But " + p[2] + ".")
        self.say("{Hero} felt {sad}.", "{He} sat down and thought.", "\"What can I do?\" said {hero}.")
        self.maybe(0.5, "Then {ffull} came by.", "{His} friend {fr} came to help.")
        self.say("Then {he} had an idea!", "Suddenly, {hero} had a good idea.", "Then {hero} smiled. {He} knew what to do.")
        self.say("{He} got " + p[3] + " and " + p[4] + ".", "{Hero} found " + p[3] + ". {He} " + p[4] + ".")
        self.say("It worked!", "Hooray, it worked!", "It was not easy, but it worked.")
        if p[5]:
            self.say(_cap(p[5]) + " was {happy}.", "\"Thank you,\" said " + p[5] + ".")
        self.say("{Hero} was proud of {himself}.", "{Hero} felt {happy} and proud.", "Everyone cheered for {hero}.")
        self.say("{Hero} learned that if you think hard, you can fix almost anything.",
                 "{Hero} learned that it is good to never give up.",
                 "That day, {hero} learned to always try again.",
                 "Then {hero} went home for dinner.")

    def gift(self) -> None:
        made = self.rng.random() < 0.5
        self.say("Tomorrow was {fr}'s birthday.", "Soon it would be {fr}'s birthday.",
                 "{Hero} wanted to give {fr} a surprise.")
        self.maybe(0.5, "{Fr} was {hero}'s best friend.", "{Hero} loved {fr} very much.")
        self.say("{Hero} thought and thought. What could {he} give?",
                 "But {hero} did not know what to give.", "{He} wanted to find the perfect gift.")
        if made:
            self.say("Then {he} had an idea. {He} would make {gift}.",
                     "{He} decided to make {gift}.")
            self.say("{He} worked all day.", "{He} worked very hard.", "It took a long time, but {he} did not stop.")
            item = "gift"
        else:
            if not self.at_place:
                self.say("{He} went to {place} to look for a gift.", "So {he} went to {place}.")
                self.at_place = True
            self.place_detail(self.rng.choice([0, 1]))
            self.say("There {he} found {a_obj}.", "There {hero} saw {a_obj}. It was perfect!",
                     "At last, {he} found {a_obj}.")
            item = self.obj
        self.say("{He} wrapped it in {colour2} paper and hid it under {his} bed.",
                 "{He} put it in a box with a {colour2} bow.", "{He} hid it behind {his} back.")
        self.say("The next day, {hero} gave the present to {fr}.", "At the party, {hero} gave {fr} the box.",
                 "\"Surprise!\" said {hero}.")
        self.say("{Fr} opened it and smiled.", "When {fr} saw the " + item + ", {fhe} was {happy}.",
                 "{Fr} was so surprised.")
        self.say("\"Thank you! I love it!\" said {fr}.", "\"It is the best gift ever!\" said {fr}.")
        self.maybe(0.7, "Then they ate {food} and played {game}.", "They had cake and sang songs.",
                   "They danced and laughed all afternoon.")
        self.say("{Hero} felt warm inside.", "Giving a gift made {hero} {happy} too.",
                 "It was a wonderful day.", "{Hero} and {fr} were {happy}.")

    def fear(self) -> None:
        f = self.rng.choice(FEARS)
        self.say("{Hero} was afraid of " + f[0] + ".", "But {hero} had a secret. {He} was afraid of " + f[0] + ".",
                 "There was one thing that {hero} did not like: " + f[0] + ".")
        self.say("Every time, {he} " + f[1] + ".", "{He} always " + f[1] + ".")
        self.maybe(0.6, "{He} felt {scared} just thinking about it.", "{He} wished {he} could be brave.")
        self.say("One day, {ffull} said, \"Come with me. I will help you.\"",
                 "One day, {his} friend {fr} said, \"Do not be afraid. I am here.\"",
                 "One day, {his} {rel} said, \"Let us try together.\"")
        self.say("{Hero} was {scared}, but {he} took a deep breath.",
                 "{Hero} held {fr}'s {fhand} tight.", "{Hero} did not want to, but {he} said yes.")
        self.say("Slowly, {he} " + f[2] + ".", "Step by step, {hero} " + f[2] + ".")
        self.say("It was not so bad! In fact, it was fun.", "Nothing bad happened.",
                 "It was not scary at all.")
        self.say("{Hero} felt brave and proud.", "{Hero} smiled a big smile.", "{Hero} was so proud of {himself}.")
        self.say("From then on, {hero} was not afraid of " + f[0] + " anymore.",
                 "Now {hero} knew that {he} could be brave.",
                 "{Hero} learned that being brave means trying even when you are scared.")

    def contest(self) -> None:
        c = self.rng.choice(CONTESTS)
        prize = self.rng.choice(PRIZES)
        if self.at_place:
            self.say("There was going to be a big " + c[0] + " there.",
                     "{He} saw a sign. It said there would be a " + c[0] + " {inplace}.")
        else:
            self.say("There was going to be a big " + c[0] + " {inplace}.",
                     "One day, {hero} heard about a " + c[0] + " {inplace}.")
        self.say("{Hero} wanted to win.", "{Hero} wanted to win the " + prize + ".",
                 "{He} wanted to try it.")
        self.say("So {he} " + c[1] + ".", "Every day, {hero} practiced. {He} " + c[1] + ".")
        self.maybe(0.6, "{Fr} helped {him} practice.", "Sometimes {he} was tired, but {he} did not give up.")
        self.say("On the day of the " + c[0] + ", many animals and children came to {place}.",
                 "At last, the day of the " + c[0] + " came.")
        self.maybe(0.6, "{Hero} felt {scared}.", "{Hero} was {excited}.")
        self.say("{Fr} was in the " + c[0] + " too.", "{Ffull} was very good at it.",
                 "{Hero} saw {ffull} who was very good too.")
        self.say("{Hero} " + c[2] + ".", "When it was {his} turn, {hero} " + c[2] + ".")
        if self.rng.random() < 0.5:
            self.say("{Hero} won! {He} got a {colour} " + prize + ".",
                     "Everyone clapped. {Hero} won the {colour} " + prize + "!")
            self.say("{Hero} was {happy}.", "{He} shared {his} " + prize + " with {fr}.")
            self.say("{He} learned that practice helps you get better.",
                     "It was the best day ever.", "That night, {hero} put the " + prize + " next to {his} bed.")
        else:
            self.say("But {fr} won the " + prize + ".", "{Fr} won, and {hero} came second.")
            self.say("{Hero} was a little {sad}, but not for long.", "{Hero} was not sad.")
            self.say("{He} had fun, and that was what mattered.",
                     "{He} said, \"Well done!\" to {fr}, and they were friends.",
                     "{He} learned that having fun is more important than winning.")

    def helping(self) -> None:
        task = self.rng.choice(HELP_TASKS)
        old = self.rng.choice(["an old " + k for k in ("bear", "owl", "turtle", "goat", "badger", "lady", "man", "mouse")])
        oref = "the " + old.split(" ", 1)[1]
        self.go_to_place()
        self.place_detail(self.rng.choice([0, 1]))
        self.say("There {hero} saw " + old + " carrying " + task[0] + ".",
                 "On the way, {hero} met " + old + " with " + task[0] + ".")
        self.say("The " + old.split(" ", 1)[1] + " was very tired.",
                 "It was too heavy for " + oref + ".")
        self.say("\"Can I help you?\" asked {hero}.", "\"Let me help you,\" said {hero}.")
        self.say("\"Oh, thank you,\" said " + oref + ".", _cap(oref) + " smiled.")
        self.say("Together they carried it " + task[1] + ".", "{Hero} carried it all the way " + task[1] + ".")
        self.maybe(0.8, "To say thank you, " + oref + " gave {hero} {food}.",
                   "As a thank you, " + oref + " gave {hero} {a_obj}.")
        self.say("{Hero} felt {happy}.", "{Hero} smiled all the way home.")
        self.say("{He} learned that helping others feels good.",
                 "Helping others made {hero} feel warm inside.",
                 "From then on, {hero} helped " + oref + " every week.")

    def rainy_day(self) -> None:
        w = self.rng.choice([("rainy", "It was raining hard."), ("snowy", "Snow was falling everywhere."),
                             ("stormy", "The wind howled and the rain came down."), ("cold", "It was too cold to go out.")])
        self.say("One " + w[0] + " day, {hero} had to stay inside. " + w[1],
                 w[1] + " {Hero} could not go to {place}.")
        self.say("{Hero} felt {feeling}.", "\"I am bored,\" said {hero}.")
        self.say("{His} {rel} said, \"Let us play a game.\"",
                 "Then {hero} had an idea. {He} went to find {his} {rel}.")
        acts = ["built a fort of blankets and pillows", "baked cookies", "drew pictures of {place}",
                "made a puppet show", "read a book about animals", "played with {his} {cobj}",
                "had a tea party with {his} toys", "painted the window"]
        self.rng.shuffle(acts)
        self.say("They " + acts[0] + ".", "First, they " + acts[0] + ". Then they " + acts[1] + ".",
                 "{Hero} " + acts[0] + ".")
        self.maybe(0.7, "Then they ate {food}.", "They drank warm milk and ate {food}.")
        self.maybe(0.5, "{Fr} came over to play too.", "Later, {ffull} knocked on the door.")
        self.say("By evening, the " + ("rain" if w[0] != "snowy" else "snow") + " had stopped.",
                 "Soon it was time for bed.", "The day went by fast.")
        self.say("{Hero} said, \"That was the best day!\"", "{Hero} learned that a " + w[0] + " day can be fun too.",
                 "{Hero} went to sleep {happy}.")


def _split_keep(text: str) -> list[str]:
    """Split a multi-sentence template fill on sentence ends so each part is capitalised."""
    parts = re.split(r"(?<=[.!?]) (?=[A-Za-z\"{])", text)
    return parts


def _fill_extra(story: _Story) -> None:
    rng, ctx = story.rng, story.ctx
    h = story.hero
    sights = rng.sample(SIGHTS, 2)
    ctx.update(
        hname=h.name or "", fname=story.friend.name or "",
        hobby=lambda: rng.choice(HOBBIES), home=lambda: rng.choice(HOMES),
        hkindfull=h.kindfull,
        a_wday=an(story.weather[0]),
        search1=lambda: rng.choice(SEARCH_SPOTS), search2=lambda: rng.choice(SEARCH_SPOTS),
        spot=rng.choice(HIDING_SPOTS),
        doing=lambda: rng.choice(["sitting under a tree", "hiding behind a rock", "sitting all alone",
                                  "crying near the path", "looking at the water", "playing by itself"]),
        game=lambda: rng.choice(GAMES), vehicle=rng.choice(VEHICLES),
        sight=sights[0], sight2=sights[1],
        excited=lambda: rng.choice(["excited", "very excited", "happy", "curious"]),
        gift=rng.choice(GIFTS_MADE), colour2=rng.choice(COLOURS[:9]),
    )


def generate_story(rng: random.Random) -> str:
    """One story drawn with *rng* (60-180 words)."""
    while True:
        story = _Story(rng)
        _fill_extra(story)
        story.opening()
        plot = rng.choice(PLOTS)
        if plot == "rainy_day" and story.at_place:  # cannot stay inside once out
            plot = rng.choice(PLOTS[:-1])
        getattr(story, plot)()
        if rng.random() < 0.12:
            story.sentences.append("The end.")
        text = story.text()
        text = re.sub(r"\s+", " ", text).strip()
        n = len(text.split())
        if MIN_WORDS <= n <= MAX_WORDS:
            return text


def generate_stories(n: int, seed: int = 0) -> list[str]:
    """*n* stories, deterministic for *seed* (uses its own ``random.Random(seed)``)."""
    rng = random.Random(seed)
    return [generate_story(rng) for _ in range(n)]


if __name__ == "__main__":  # pragma: no cover - a quick look at the corpus
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for s in generate_stories(args.n, args.seed):
        print(s, end="\n\n")
