"""The warehouse table the stock-table MCP server serves (made-up codes: no model knows them)."""

STOCK = {
    "copper kettle": "CK-4417", "linen apron": "LA-2093", "oak stool": "OS-7781",
    "brass lamp": "BL-3306",
    "wool blanket": "WB-5520", "glass jar": "GJ-1184", "iron skillet": "IS-9062",
    "clay pot": "CP-6645",
    "silk scarf": "SS-2871", "pine shelf": "PS-4409", "steel ladle": "SL-7738",
    "cotton towel": "CT-3152",
    "bamboo tray": "BT-8824", "tin bucket": "TB-1967", "felt hat": "FH-5093",
    "cork board": "CB-6210",
}
SPLIT_OF = {"felt hat": "holdout", "cork board": "holdout", "tin bucket": "holdout",
            "bamboo tray": "holdout",
            "pine shelf": "validation", "steel ladle": "validation"}  # every other item: train
