"""The class names of UniDet's unified label space, against which T2I-CompBench matches prompt nouns.

The official detector-based metrics (`UniDet_eval/2D_spatial_eval.py`, `3D_spatial_eval.py`,
`numeracy_eval.py` of Karine-Huang/T2I-CompBench) name each detection by these 722 labels (677
distinct; `UniDet_eval/dataset/detection_features.pt`, its "labels", at commit 1b70949, sha256
c38ba935...9c76) and look the prompt's nouns up among the names of what was detected: the 2D rule
(and 3-in-1's spatial term) by equality (`obj1 in obj`), the 3D and numeracy rules as a part of a
label (`obj1 in obj[i]`). A noun that no label equals (2D: "cow", whose label is "cattle, cow";
"table", "wallet", "mouse") or contains (3D: "painting", "wallet") is never found, whatever the image
shows: about a third of the 2D-spatial prompts score 0 in the published numbers for that reason.

gors' detectors are open-vocabulary (UniDet is not installable) and are asked for the nouns
themselves. `label_space="unidet"` (the T2I-CompBench rules' default) asks them only for the nouns
UniDet could name, so that the numbers compare with the published ones; `"open"` asks for every noun.
What is not reproduced: boxes of a label that merely contains a noun ("monkey" or "keyboard" for
"key" in the 3D and numeracy rules), which the official matching takes as that noun.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

LabelSpace = Literal["unidet", "open"]
LABEL_SPACES: tuple[str, ...] = ("unidet", "open")

UNIDET_LABELS: tuple[str, ...] = (
    'bottle', 'cup', 'dining table', 'cake', 'wild bird', 'knife', 'remote', 'microwave', 'frisbee', 'toothbrush',
    'footwear, sneakers', 'picture, frame', 'table, desk', 'street light', 'book', 'helmet', 'pillow',
    'box, storage box', 'bowl', 'watercraft, boat', 'flag', 'stool', 'doll, toy', 'pen, pen/pencil', 'microphone',
    'tap, faucet', 'bread', 'sandal, high heels', 'fish', 'camera', 'candle', 'paddle', 'drum', 'guitar',
    'kettle, tea pot', 'ceiling fan, fan', 'whiteboard, blackboard', 'balloon', 'corded phone, telephone', 'orange',
    'football, soccer', 'toilet paper, paper towel', 'tomato', 'tent', 'lantern', 'kite', 'gas stove',
    'spatula, shovel', 'rifle, gun', 'lemon', 'squash, pumpkin', 'musical keyboard, piano', 'washing machine',
    'cookie, cookies', 'cutting board, cutting/chopping board', 'roller skates, skating and skiing shoes',
    'cricket ball, baseball', 'strawberry', 'coffeemaker, coffee machine', 'suitcase', 'grape, grapes', 'ladder',
    'pear', 'rugby ball, american football', 'printer', 'duck, goose', 'tennis ball', 'chopsticks', 'hamburger',
    'cucumber', 'mixer, blender', 'deer', 'egg', 'barge, ship', 'turkey, chicken', 'ice cream', 'adhesive tape, tape',
    'wheelchair', 'cabbage', 'golf ball', 'peach', 'cello', 'helicopter', 'penguin', 'swan', 'french fries',
    'saxophone', 'trombone, trumpet', 'raccoon, bear', 'tablet computer, tablet', 'volleyball', 'dumbbell', 'camel',
    'goldfish', 'antelope', 'shrimp', 'cart, rickshaw', 'coconut', 'jellyfish', 'treadmill', 'butterfly', 'pig',
    'shower, hair drier', 'asparagus, green onion', 'dolphin', 'sushi', 'burrito, spring rolls',
    'tortoise, tortoise/turtle', 'parrot', 'flute', 'shark', 'binoculars', 'alpaca, llama', 'pasta, noodles',
    'shellfish, crab', 'lion', 'polar bear', 'sea lion, seal', 'table tennis racket, table tennis paddle', 'starfish',
    'falcon, eagle', 'monkey', 'rabbit', 'ambulance', 'segway, hoverboard', 'truck', 'boat', 'bear', 'handbag',
    'ball', 'sandwich', 'bidet', 'computer monitor', 'vase', 'person', 'chair', 'car', 'houseplant, potted plant',
    'bench', 'wine glass', 'umbrella', 'backpack', 'loveseat, couch', 'tie', 'infant bed, bed', 'traffic light',
    'bicycle', 'sink', 'horse', 'apple', 'teddy bear', 'motorcycle', 'laptop', 'mobile phone, cell phone',
    'cattle, cow', 'clock', 'fork', 'bus', 'sheep', 'computer keyboard, keyboard', 'dog', 'spoon', 'mouse2, mouse',
    'banana', 'airplane', 'briefcase, luggage', 'ski, skis', 'baseball glove', 'refrigerator', 'train',
    'doughnut, donut', 'grapefruit, tangerine', 'pizza', 'elephant', 'broccoli', 'baseball bat', 'skateboard',
    'surfboard', 'cat', 'zebra', 'giraffe', 'stop sign', 'carrot', 'tennis racket', 'scissors', 'snowboard',
    'fire hydrant', 'hot dog', 'toaster', 'hat', 'lamp', 'cabinet/shelf', 'glasses', 'handbag', 'plate',
    'leather shoes', 'glove', 'bracelet', 'flower', 'tv', 'vase', 'boots', 'speaker', 'trash bin, can', 'belt',
    'carpet', 'basket', 'towel, napkin', 'slippers', 'barrel, bucket', 'coffee table', 'suv', 'sandals', 'canned',
    'necklace', 'mirror', 'ring', 'van', 'watch', 'traffic sign', 'truck', 'power outlet', 'hanger', 'nightstand',
    'pot, pan', 'traffic cone', 'tripod', 'hockey', 'air conditioner', 'cymbal', 'pickup truck', 'trolley', 'oven',
    'machinery vehicle', 'shampoo, shower gel', 'head phone', 'cleaning products', 'sailboat', 'computer box',
    'toiletries', 'toilet', 'stroller', 'surveillance camera', 'life saver', 'liquid soap', 'duck', 'sports car',
    'radiator', 'converter', 'tissue ', 'vent', 'candy', 'folder', 'bow tie', 'pigeon', 'pepper', 'bathtub',
    'basketball', 'potato', 'paint brush', 'billiards', 'projector', 'sausage', 'fire extinguisher', 'extension cord',
    'facial mask', 'electronic stove and gas stove', 'pie', 'kettle', 'golf club', 'clutch', 'tong', 'slide',
    'facial cleanser', 'mango', 'violin', 'marker', 'onion', 'plum', 'bar soap', 'scale', 'watermelon',
    'router, modem', 'pine apple', 'crane', 'fire truck', 'notepaper', 'tricycle', 'green beans', 'brush', 'carriage',
    'cigar', 'earphone', 'hurdle', 'swing', 'radio', 'cd', 'parking meter', 'garlic', 'horn', 'avocado', 'sandwich',
    'cue', 'kiwi fruit', 'fishing rod', 'cherry', 'green vegetables', 'nuts', 'corn', 'key', 'screwdriver', 'globe',
    'broom', 'pliers', 'hammer', 'eggplant', 'trophy', 'dates', 'board eraser', 'rice', 'tape measure, ruler',
    'hamimelon', 'stapler', 'lettuce', 'meat balls', 'medal', 'toothpaste', 'trombone', 'pomegranate', 'mushroom',
    'calculator', 'egg tart', 'cheese', 'pomelo', 'race car', 'rice cooker', 'tuba', 'crosswalk sign', 'papaya',
    'chips', 'urinal', 'donkey', 'electric drill', 'measuring cup', 'steak', 'poker card', 'radish', 'yak', 'mop',
    'microscope', 'barbell', 'bread/bun', 'baozi', 'red cabbage', 'lighter', 'mangosteen', 'comb', 'eraser', 'pitaya',
    'scallop', 'pencil case', 'saw', 'okra', 'durian', 'game board', 'french horn', 'asparagus', 'pasta', 'target',
    'hotair balloon', 'chainsaw', 'lobster', 'iron', 'flashlight', 'parking meter', 'kite', 'bowl', 'oven', 'book',
    'hair drier', 'rose', 'flashlight', 'sea turtle', 'animal', 'glove', 'crocodile', 'house', 'guacamole',
    'vehicle registration plate', 'bench1', 'ladybug', 'human nose', 'watermelon', 'taco', 'cake', 'cannon', 'tree',
    'bed', 'hamster', 'hat', 'sombrero', 'tiara', 'dragonfly', 'moths and butterflies', 'vegetable', 'torch',
    'building', 'power plugs and sockets', 'blender', 'billiard table', 'bronze sculpture', 'turtle', 'tiger',
    'mirror', 'zucchini', 'dress', 'reptile', 'golf cart', 'tart', 'fedora', 'carnivore', 'lighthouse',
    'food processor', 'bookcase', 'necklace', 'flower', 'radish', 'marine mammal', 'frying pan', 'knife',
    'christmas tree', 'eagle', 'limousine', 'kitchen & dining room table', 'tower', 'willow', 'human head', 'dessert',
    'bee', 'wood-burning stove', 'flowerpot', 'beaker', 'oyster', 'woodpecker', 'harp', 'bathtub', 'wall clock',
    'sports uniform', 'rhinoceros', 'beehive', 'cupboard', 'chicken', 'man', 'blue jay', 'fireplace', 'missile',
    'squirrel', 'coat', 'punching bag', 'billboard', 'door handle', 'mechanical fan', 'ring binder', 'sock', 'weapon',
    'shotgun', 'glasses', 'seahorse', 'belt', 'window', 'tire', 'vehicle', 'canoe', 'shelf', 'human leg',
    'slow cooker', 'croissant', 'pancake', 'coin', 'stretcher', 'woman', 'stairs', 'harpsichord', 'human mouth',
    'juice', 'skull', 'door', 'violin', 'digital clock', 'sunflower', 'leopard', 'bell pepper', 'harbor seal',
    'snake', 'sewing machine', 'goose', 'seat belt', 'coffee cup', 'microwave oven', 'countertop', 'serving tray',
    'dog bed', 'beer', 'sunglasses', 'waffle', 'palm tree', 'trumpet', 'ruler', 'office building', 'pomegranate',
    'skirt', 'raven', 'goat', 'kitchen knife', 'salt and pepper shakers', 'lynx', 'boot', 'platter', 'swimwear',
    'swimming pool', 'drinking straw', 'wrench', 'ant', 'human ear', 'headphones', 'fountain', 'bird', 'jeans',
    'television', 'crab', 'home appliance', 'snowplow', 'beetle', 'artichoke', 'jet ski', 'stationary bicycle',
    'human hair', 'brown bear', 'lobster', 'drink', 'saucer', 'insect', 'castle', 'jaguar', 'musical instrument',
    'taxi', 'pitcher', 'invertebrate', 'high heels', 'bust', 'scarf', 'barrel', 'pumpkin', 'frog', 'human face',
    'van', 'swim cap', 'ostrich', 'handgun', 'lizard', 'snowmobile', 'light bulb', 'window blind', 'muffin',
    'pretzel', 'horn', 'furniture', 'fox', 'convenience store', 'fruit', 'earrings', 'curtain', 'sofa bed',
    'luggage and bags', 'desk', 'crutch', 'bicycle helmet', 'tick', 'canary', 'watch', 'lily', 'kitchen appliance',
    'filing cabinet', 'aircraft', 'cake stand', 'candy', 'mouse1', 'wine', 'drawer', 'picnic basket', 'dice',
    'football helmet', 'shorts', 'gondola', 'honeycomb', 'chest of drawers', 'land vehicle', 'bat', 'dagger',
    'tableware', 'human foot', 'mug', 'alarm clock', 'pressure cooker', 'human hand', 'sword', 'miniskirt',
    'traffic sign', 'girl', 'dinosaur', 'porch', 'human beard', 'submarine sandwich', 'screwdriver', 'seafood',
    'racket', 'wheel', 'toy', 'tea', 'waste container', 'mule', 'pineapple', 'coffee table', 'snowman', 'lavender',
    'maple', 'cowboy hat', 'goggles', 'caterpillar', 'poster', 'rocket', 'organ', 'cocktail', 'plastic bag',
    'mushroom', 'light switch', 'parachute', 'winter melon', 'plumbing fixture', 'scoreboard', 'envelope',
    'bow and arrow', 'telephone', 'jacket', 'boy', 'otter', 'office supplies', 'couch', 'bull', 'whale', 'shirt',
    'tank', 'accordion', 'owl', 'porcupine', 'sun hat', 'nail', 'lamp', 'crown', 'piano', 'sculpture', 'cheetah',
    'oboe', 'tin can', 'mango', 'tripod', 'oven', 'coffee', 'common fig', 'salad', 'marine invertebrates', 'kangaroo',
    'human arm', 'measuring cup', 'snail', 'suit', 'teapot', 'bottle', 'trousers', 'popcorn', 'centipede', 'spider',
    'sparrow', 'plate', 'bagel', 'personal care', 'brassiere', 'bathroom cabinet', 'studio couch', 'cabinetry',
    'towel', 'nightstand', 'jug', 'wok', 'human eye', 'skyscraper', 'potato', 'paper towel', 'lifejacket',
    'bicycle wheel', 'toilet', 'crosswalk', 'bicyclist', 'motorcyclist', 'other rider', 'crosswalk zebra', 'banner',
    'bike rack', 'catch basin', 'cctv camera', 'junction box', 'mailbox', 'manhole', 'phone booth', 'street light',
    'pole', 'traffic sign frame', 'utility pole', 'traffic sign back', 'boat', 'caravan', 'trailer',
)


def split_by_label_space(names: Iterable[str], label_space: LabelSpace,
                         exact: bool) -> tuple[list[str], list[str]]:
    """(the distinct `names` the label space can name, in order; those it cannot): with "unidet", a name
    some UniDet label equals (`exact`, the 2D rule's lookup) or is a part of (the 3D and numeracy rules');
    with "open", every name."""
    distinct = list(dict.fromkeys(names))
    if label_space == "open":
        return distinct, []
    if exact:
        named = [name for name in distinct if name in _LABEL_SET]
    else:
        named = [name for name in distinct if any(name in label for label in UNIDET_LABELS)]
    return named, [name for name in distinct if name not in named]


def unnamed_note(unnamed: Sequence[str], exact: bool) -> str:
    """What a reason adds for the names `split_by_label_space` left out (never asked for, so never found): ''
    where none was; `exact` as there."""
    if not unnamed:
        return ""
    return f" ({', '.join(map(repr, unnamed))}: {'no' if exact else 'in no'} UniDet class, never found)"


_LABEL_SET = frozenset(UNIDET_LABELS)
